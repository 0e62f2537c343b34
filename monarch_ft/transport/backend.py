"""The small interface every data-plane backend implements.

Why: the control plane (who serves which step, sessions, revocation, retries)
is the same whatever moves the bytes, so backends only do three things:
expose (register) the sender's buffers, read chunks into the receiver's
buffers, and report per-chunk success so the caller can retry the rest from
another peer.  "Notify" (the end-of-transfer handshake) stays on the control
connection, see ``sharded.py``.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch

from monarch_ft.transport.header import Deadline, Header


@dataclass(frozen=True)
class Peer:
    """A serving ShardedTransport, as parsed from its metadata string."""

    host: str
    port: int

    def __str__(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"mft1://{h}:{self.port}"


@dataclass
class FetchResult:
    """Chunks that arrived verified, and the first error per failed stream."""

    good: Set[int]
    errors: List[BaseException]


class Backend(ABC):
    """Moves chunk bytes from a peer's exposed tensors into local buffers."""

    name: str = "?"

    def expose(self, views: Sequence[torch.Tensor]) -> Optional[Dict[str, Any]]:
        """Sender side: registers ``views`` (uint8 spans); returns info for the header."""
        return None

    def unexpose(self) -> None:
        """Sender side: forgets the last exposed buffers (after disallow_checkpoint)."""

    @abstractmethod
    def fetch(
        self,
        peer: Peer,
        header: Header,
        chunk_ids: List[int],
        dst: List[torch.Tensor],
        deadline: Deadline,
        remote_checksums: Callable[[List[int]], List[int]],
    ) -> FetchResult:
        """Receiver side: fills ``dst`` for ``chunk_ids`` and verifies each chunk."""

    def close(self) -> None:
        """Releases sockets, threads and registered memory."""


def split_round_robin(ids: List[int], n: int) -> List[List[int]]:
    """Interleaves chunks over ``n`` streams so every stream gets a similar byte count."""
    n = max(1, min(n, len(ids)))
    return [ids[i::n] for i in range(n)]


def run_streams(fns: List[Callable[[], None]]) -> List[Tuple[int, BaseException]]:
    """Runs each fn in its own thread, joins all, returns (index, exception) failures."""
    import threading

    errors: List[Tuple[int, BaseException]] = []
    lock = threading.Lock()

    def wrap(i: int, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: B902 - reported to the caller
            with lock:
                errors.append((i, e))

    threads = [threading.Thread(target=wrap, args=(i, fn), name=f"mft-stream-{i}", daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
