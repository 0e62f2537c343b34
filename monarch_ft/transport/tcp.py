"""Our TCP data plane: zero-copy sends from tensor memory, several sockets at once.

Why not HTTP + torch.save: serialising copies every byte (often twice) and a
single HTTP stream tops out far below what loopback or a NIC can do.  Here the
sender ``sendall``s memoryviews that alias its tensors' storage and the
receiver ``recv_into``s memoryviews of preallocated tensors, over
``num_streams`` connections in parallel threads (socket calls release the GIL),
each connection streaming its chunks back to back so the kernel pipelines
reading, sending and the receiver's checksumming.
"""

import socket
import threading
from typing import Callable, List

import torch

from monarch_ft.transport import checksum as ck
from monarch_ft.transport.backend import Backend, FetchResult, Peer, run_streams, split_round_robin
from monarch_ft.transport.errors import (
    ChecksumMismatchError,
    PeerUnreachableError,
    ProtocolError,
    StaleCheckpointError,
)
from monarch_ft.transport.header import (
    CHUNK_HDR,
    CHUNK_MAGIC,
    CRC_TRAILER,
    WINDOW,
    Deadline,
    Header,
    memview,
    recv_exact,
    send_msg,
)


def tune(sock: socket.socket) -> None:
    """Low latency for the small frame headers.

    SO_SNDBUF/SO_RCVBUF are deliberately left alone: setting them disables
    Linux's buffer autotuning, which grows buffers further than we would.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(peer: Peer, deadline: Deadline, doing: str) -> socket.socket:
    try:
        sock = socket.create_connection((peer.host, peer.port), timeout=deadline.remaining(doing))
    except socket.timeout:
        deadline.expired(f"connecting to {peer}")
        raise
    except OSError as e:
        raise PeerUnreachableError(f"cannot connect to {peer}: {e}") from e
    tune(sock)
    return sock


def listen(bind_host: str) -> socket.socket:
    """Dual-stack listening socket on an ephemeral port."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((bind_host or "::", 0))
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((bind_host or "0.0.0.0", 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.listen(128)
    return sock


def send_error_frame(sock: socket.socket, chunk_id: int, step: int, msg: str) -> None:
    data = msg.encode()[:4096]
    try:
        sock.sendall(CHUNK_HDR.pack(CHUNK_MAGIC, 1, chunk_id, step, len(data), 0) + data)
    except OSError:
        pass


class TCPBackend(Backend):
    """Receiver side of our TCP protocol (the serving side lives in ``sharded.py``)."""

    name = "tcp"

    def __init__(self, num_streams: int) -> None:
        self.num_streams = num_streams
        self._lock = threading.Lock()
        self._open: set = set()

    def fetch(
        self,
        peer: Peer,
        header: Header,
        chunk_ids: List[int],
        dst: List[torch.Tensor],
        deadline: Deadline,
        remote_checksums: Callable[[List[int]], List[int]],
    ) -> FetchResult:
        mvs = [memview(t) for t in dst]
        good: set = set()
        glock = threading.Lock()
        algo = header.checksum

        def stream(ids: List[int]) -> None:
            doing = f"receiving chunks from {peer}"
            sock = connect(peer, deadline, doing)
            with self._lock:
                self._open.add(sock)
            try:
                send_msg(sock, {"op": "chunks", "gen": header.gen, "step": header.step, "ids": ids, "algo": algo})
                hdr = bytearray(CHUNK_HDR.size)
                trailer = bytearray(CRC_TRAILER.size)
                for cid in ids:
                    recv_exact(sock, memoryview(hdr), deadline, f"{doing} (chunk {cid} header)")
                    magic, status, rid, rstep, nbytes, _ = CHUNK_HDR.unpack(hdr)
                    if magic != CHUNK_MAGIC:
                        raise ProtocolError(f"bad chunk magic {bytes(magic)!r} from {peer}")
                    if status != 0:
                        text = bytearray(nbytes)
                        recv_exact(sock, memoryview(text), deadline, doing)
                        msg = text.decode(errors="replace")
                        if "stale" in msg or "no longer served" in msg:
                            raise StaleCheckpointError(f"{peer}: {msg}")
                        raise ProtocolError(f"{peer} failed to serve chunk {cid}: {msg}")
                    if rstep != header.step:
                        raise StaleCheckpointError(f"stale chunk {rid} from {peer}: step {rstep}, expected step {header.step}")
                    if rid != cid or nbytes != header.chunk_nbytes[cid]:
                        raise ProtocolError(f"{peer} sent chunk {rid} ({nbytes} B), expected chunk {cid} ({header.chunk_nbytes[cid]} B)")
                    got = 0
                    for t_idx, off, n in header.chunks[cid]:
                        v = mvs[t_idx][off : off + n]
                        for w in range(0, n, WINDOW):
                            win = v[w : w + WINDOW]
                            recv_exact(sock, win, deadline, f"{doing} (chunk {cid})")
                            got = ck.update(algo, win, got)
                    recv_exact(sock, memoryview(trailer), deadline, f"{doing} (chunk {cid} checksum)")
                    (crc,) = CRC_TRAILER.unpack(trailer)
                    got &= 0xFFFFFFFF
                    if got != crc:
                        raise ChecksumMismatchError(f"checksum mismatch in chunk {cid} from {peer}: got {got:#010x}, sender said {crc:#010x}")
                    with glock:
                        good.add(cid)
            finally:
                with self._lock:
                    self._open.discard(sock)
                sock.close()

        groups = split_round_robin(chunk_ids, self.num_streams)
        errs = run_streams([lambda g=g: stream(g) for g in groups])
        return FetchResult(good=good, errors=[e for _, e in errs])

    def close(self) -> None:
        with self._lock:
            for s in list(self._open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
