"""Builds a checkpoint transport by name, for the supervisor's config.

Why a factory: the supervisor reads the transport name from config and must
not import each implementation or know their constructor quirks.
"""

from datetime import timedelta
from typing import Any

from torchft.checkpointing.transport import CheckpointTransport

NAMES = ("sharded", "http", "pg")


def build_checkpoint_transport(name: str, timeout: timedelta, **kw: Any) -> CheckpointTransport:
    """Returns a transport: "sharded" (ours; kw go to ShardedTransport),
    "http" (torchft HTTPTransport(timeout, num_chunks=0 unless kw num_chunks)),
    "pg" (torchft PGTransport; needs ``pg=`` and optionally ``device=``, ``state_dict=``)."""
    if name == "sharded":
        from monarch_ft.transport.sharded import ShardedTransport

        return ShardedTransport(timeout=timeout, **kw)
    if name == "http":
        from torchft.checkpointing.http_transport import HTTPTransport

        return HTTPTransport(timeout, num_chunks=kw.pop("num_chunks", 0))
    if name == "pg":
        pg = kw.pop("pg", None)
        if pg is None:
            raise ValueError("PGTransport needs a process group: pass pg=<torchft ProcessGroup> to build_checkpoint_transport('pg', ...)")
        import torch
        from torchft.checkpointing.pg_transport import PGTransport

        return PGTransport(pg, timeout=timeout, device=kw.pop("device", torch.device("cpu")), state_dict=kw.pop("state_dict", None))
    raise ValueError(f"unknown checkpoint transport {name!r}; expected one of {', '.join(NAMES)}")
