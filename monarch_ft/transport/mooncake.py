"""Mooncake Transfer Engine data plane: registered buffers, one-sided reads.

Why: on RDMA NICs Mooncake reads the sender's registered tensor memory
directly (no sender CPU in the data path); its ``tcp`` protocol has the same
API, which is how the registration/addressing/transfer code is exercised on
machines without RDMA.  We run it in ``P2PHANDSHAKE`` mode so no metadata
server is needed: the target of a read is ``"host:rpc_port"`` of the peer's
engine, which the sender puts in the checkpoint header with the address of
every exposed tensor span.

Integrity: one-sided reads leave no chance for the sender to stamp chunks, so
the receiver checksums what it read and compares with checksums the sender
computes (in the background, from the first header request) and returns over
the control connection.  Return codes of the engine are checked for every
transfer, but never used to *detect* RDMA (see ``rdma_discovery.py``).
"""

import logging
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from monarch_ft.transport import checksum as ck
from monarch_ft.transport.backend import Backend, FetchResult, Peer, run_streams, split_round_robin
from monarch_ft.transport.errors import ChecksumMismatchError, TransportError
from monarch_ft.transport.header import Deadline, Header, memview

logger: logging.Logger = logging.getLogger(__name__)


def import_engine() -> Any:
    """Imports mooncake's TransferEngine class or raises ImportError with the fix."""
    os.environ.setdefault("GLOG_minloglevel", "2")  # engine logs a lot at INFO
    try:
        from mooncake.engine import TransferEngine  # type: ignore[import-not-found]
    except Exception as e:
        raise ImportError(
            f"mooncake transfer engine unavailable: pip install mooncake-transfer-engine-non-cuda (and apt libibverbs1 libnuma1): {type(e).__name__}: {e}"
        ) from e
    return TransferEngine


class MooncakeBackend(Backend):
    """One TransferEngine per transport; serves and reads with the same engine."""

    def __init__(self, host: str, protocol: str = "tcp", device: str = "", num_streams: int = 4) -> None:
        engine_cls = import_engine()
        self.protocol = protocol
        self.name = f"mooncake-{protocol}"
        self.num_streams = num_streams
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            ip = host
        self._engine = engine_cls()
        ret = self._engine.initialize(ip, "P2PHANDSHAKE", protocol, device)
        if ret != 0:
            raise TransportError(f"mooncake initialize({ip!r}, P2PHANDSHAKE, {protocol!r}, {device!r}) returned {ret}")
        self.target = f"{ip}:{self._engine.get_rpc_port()}"
        self._lock = threading.Lock()
        self._exposed: List[int] = []
        logger.info("mooncake engine up: protocol=%s device=%r target=%s", protocol, device, self.target)

    # -- registration -------------------------------------------------------
    def _register(self, views: Sequence[torch.Tensor]) -> List[int]:
        ptrs = [v.data_ptr() for v in views if v.numel()]
        sizes = [v.numel() for v in views if v.numel()]
        if ptrs:
            ret = self._engine.batch_register_memory(ptrs, sizes)
            if ret != 0:
                raise TransportError(f"mooncake batch_register_memory of {len(ptrs)} buffers returned {ret}")
        return ptrs

    def _unregister(self, ptrs: List[int]) -> None:
        if ptrs:
            self._engine.batch_unregister_memory(ptrs)

    def expose(self, views: Sequence[torch.Tensor]) -> Optional[Dict[str, Any]]:
        with self._lock:
            self._unregister(self._exposed)
            self._exposed = self._register(views)
        return {"target": self.target, "addrs": [v.data_ptr() for v in views]}

    def unexpose(self) -> None:
        with self._lock:
            self._unregister(self._exposed)
            self._exposed = []

    # -- reads ----------------------------------------------------------------
    def fetch(
        self,
        peer: Peer,
        header: Header,
        chunk_ids: List[int],
        dst: List[torch.Tensor],
        deadline: Deadline,
        remote_checksums: Callable[[List[int]], List[int]],
    ) -> FetchResult:
        info = header.mooncake
        assert info is not None
        target, addrs = info["target"], info["addrs"]
        mvs = [memview(t) for t in dst]
        local_crc: Dict[int, int] = {}
        lock = threading.Lock()
        algo = header.checksum
        regs = self._register(dst)
        try:

            def stream(ids: List[int]) -> None:
                for cid in ids:
                    deadline.remaining(f"reading chunk {cid} from {target} over mooncake")
                    pieces = header.chunks[cid]
                    ret = self._engine.batch_transfer_sync_read(
                        target,
                        [dst[i].data_ptr() + off for i, off, _ in pieces],
                        [addrs[i] + off for i, off, _ in pieces],
                        [n for _, _, n in pieces],
                    )
                    if ret < 0:
                        raise TransportError(f"mooncake read of chunk {cid} from {target} failed (ret={ret})")
                    c = ck.checksum(algo, [mvs[i][off : off + n] for i, off, n in pieces])
                    with lock:
                        local_crc[cid] = c

            errs = [e for _, e in run_streams([lambda g=g: stream(g) for g in split_round_robin(chunk_ids, self.num_streams)])]
        finally:
            self._unregister(regs)
        read = sorted(local_crc)
        good = set()
        if read:
            remote = remote_checksums(read)
            for cid, rc in zip(read, remote):
                if rc == local_crc[cid]:
                    good.add(cid)
                elif not errs:
                    errs.append(
                        ChecksumMismatchError(f"checksum mismatch in chunk {cid} read from {target}: got {local_crc[cid]:#010x}, sender has {rc:#010x}")
                    )
        return FetchResult(good=good, errors=errs)

    def close(self) -> None:
        self.unexpose()
        self._engine = None
