"""ShardedTransport: torchft CheckpointTransport that moves live state shard by shard.

Why: after a fault, recovery time is dominated by copying weights and optimizer
state from a healthy replica group to the restarted one.  torchft's Manager
already pairs each recovering rank with the same group rank of a healthy
group, so every rank transfers only its own shard, all ranks in parallel.
This class makes each of those transfers fast and safe:

* fast: a pickled header describes the tensors, then raw tensor bytes flow in
  ~chunk_size chunks over ``num_streams`` parallel connections (our TCP) or
  one-sided Mooncake reads, straight between tensor memories;
* safe: every chunk is checksummed, steps and stagings are checked, failed
  chunks are re-fetched from another healthy peer if one is known, and the
  state dict is only returned once every chunk verified;
* contract: after ``disallow_checkpoint()`` returns no byte of that state dict
  is served again -- in-flight readers are drained (up to ``drain_timeout``)
  and then cut off, which their receivers detect and report.

Backend choice (``backend="auto"``): Mooncake over RDMA when pyverbs finds an
ACTIVE port (one-sided reads, no sender CPU in the data path); otherwise *our*
TCP, not Mooncake's tcp protocol: measured on loopback (2 cores), our TCP
moved 1 GB at ~4-5 GB/s and Mooncake-tcp at ~1.2 GB/s
(``benchmarks/transport_bench.py``).

Metadata is ``mft1://host:port`` (several peers may be joined with ``,``); it
names the control socket, from which the receiver learns everything else.

Notes:
* DTensors ship their local shard's bytes like any tensor, plus their spec
  (mesh, placements, global shape and stride) in the pickled header.  They
  arrive as DTensors: received in place into a template DTensor of the same
  local layout; else on the template's mesh if the template has a DTensor at
  that path; else with the sender's spec, equal to it (TorchFT's contract:
  its conformance test compares specs).  The shipped mesh keeps the sender's
  rank coordinates, which are the receiver's too because TorchFT pairs equal
  group ranks of different replica groups.
* Strides are preserved; the storage offset is relative to the shipped span
  (unreferenced storage is not shipped).
* In-place receive (template tensors with identical dtype/shape/strides on
  CPU) writes into the template while the transfer runs, like PGTransport; on
  failure the call raises and those tensors hold unspecified data.
"""

import dataclasses
import itertools
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, TypeVar, Union

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path
from torchft.checkpointing.transport import CheckpointTransport

from monarch_ft.transport import checksum as ck
from monarch_ft.transport.backend import Backend, Peer
from monarch_ft.transport.errors import (
    AllPeersFailedError,
    ProtocolError,
    StaleCheckpointError,
    TransferTimeoutError,
    TransportError,
)
from monarch_ft.transport.header import (
    CHUNK_HDR,
    CHUNK_MAGIC,
    CRC_TRAILER,
    WINDOW,
    Deadline,
    Header,
    build_header,
    byte_view,
    memview,
    recv_msg,
    send_msg,
    span_elems,
    unflatten,
)
from monarch_ft.transport.tcp import TCPBackend, connect, listen, send_error_frame, tune

logger: logging.Logger = logging.getLogger(__name__)

T = TypeVar("T")
SCHEME = "mft1://"


# ------------------------------------------------------------------ metadata


def format_metadata(peers: Sequence[Peer]) -> str:
    return ",".join(str(p) for p in peers)


def parse_metadata(metadata: str) -> List[Peer]:
    """Parses ``mft1://host:port[,mft1://host:port...]``; raises ValueError on junk."""
    peers = []
    for part in metadata.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.startswith(SCHEME):
            raise ValueError(f"not a ShardedTransport address: {part!r} (expected {SCHEME}host:port)")
        hostport = part[len(SCHEME) :]
        if hostport.startswith("["):
            host, _, port = hostport[1:].partition("]:")
        else:
            host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad ShardedTransport address {part!r}")
        peers.append(Peer(host, int(port)))
    if not peers:
        raise ValueError(f"empty ShardedTransport metadata {metadata!r}")
    return peers


# ------------------------------------------------------------------ sender state


class _Staging:
    """One send_checkpoint: the header and uint8 views aliasing the live tensors."""

    def __init__(self, header: Header, views: List[torch.Tensor]) -> None:
        self.header = header
        self.views = views
        self.mvs = [memview(v) for v in views]
        self.crcs: Dict[str, Dict[int, int]] = {}
        self.crc_future: Dict[str, Future] = {}
        # Staged on a receiver's request from an offer (see ShardedTransport.offer), not by send_checkpoint.
        self.on_demand = False

    def chunk_views(self, cid: int) -> List[memoryview]:
        return [self.mvs[i][off : off + n] for i, off, n in self.header.chunks[cid]]

    def crc(self, algo: str, cid: int) -> int:
        cache = self.crcs.setdefault(algo, {})
        c = cache.get(cid)
        if c is None:
            c = ck.checksum(algo, self.chunk_views(cid))
            cache[cid] = c
        return c


def _select_backend(backend: str, host: str, num_streams: int, device: Optional[str]) -> Backend:
    """Resolves "auto"/"tcp"/"mooncake"[-tcp|-rdma] to a backend, logging why."""
    if backend not in ("auto", "tcp", "mooncake", "mooncake-tcp", "mooncake-rdma"):
        raise ValueError(f"unknown backend {backend!r}; expected auto, tcp, mooncake, mooncake-tcp or mooncake-rdma")
    if backend == "tcp":
        logger.info("ShardedTransport backend: tcp (requested)")
        return TCPBackend(num_streams)

    from monarch_ft.transport import rdma_discovery
    from monarch_ft.transport.mooncake import MooncakeBackend

    if backend in ("auto", "mooncake", "mooncake-rdma"):
        found = rdma_discovery.discover()
        if found.available and backend != "mooncake-tcp":
            port = found.best
            assert port is not None
            try:
                b = MooncakeBackend(host, "rdma", device or port.device, num_streams)
                logger.info("ShardedTransport backend: mooncake-rdma because %s", found.reason)
                return b
            except Exception as e:
                logger.warning("mooncake rdma failed to start (%s); falling back", e)
        elif backend == "mooncake-rdma":
            raise TransportError(f"backend mooncake-rdma requested but no RDMA: {found.reason}")
        if backend == "auto":
            logger.info("ShardedTransport backend: tcp (auto) because %s", found.reason)
            return TCPBackend(num_streams)
    try:
        b = MooncakeBackend(host, "tcp", "", num_streams)
        logger.info("ShardedTransport backend: mooncake-tcp (requested %s)", backend)
        return b
    except Exception as e:
        logger.warning("ShardedTransport backend: tcp because mooncake could not start: %s", e)
        return TCPBackend(num_streams)


class ShardedTransport(CheckpointTransport[T]):
    """Parallel, chunked, checksummed transfer of one rank's state dict shard.

    Args:
        timeout: default timeout for transfers and for draining readers.
        backend: "auto" (mooncake-rdma when pyverbs finds an ACTIVE port, else
            our TCP), "tcp", "mooncake" (rdma if available else its tcp
            protocol), "mooncake-tcp" or "mooncake-rdma".  Falls back to our
            TCP wherever the engine cannot start.
        num_streams: parallel connections / reader threads per transfer.
        chunk_size: bytes per chunk (unit of checksum, parallelism and retry).
        host: hostname/IP to advertise in ``metadata()``
            (default ``$MONARCH_FT_TRANSPORT_HOST`` or ``socket.gethostname()``;
            monarch_ft's ranks pass the address ``ft.transport_interface`` picks,
            see :mod:`monarch_ft.transport.interface`).
        bind_host: address to listen on (default: all; monarch_ft's ranks: ``host``).
        state_dict_template: returns a state dict whose tensors are reused for
            in-place receive (like PGTransport's ``state_dict``), and whose
            DTensors provide the mesh to rebuild received DTensors on.
        fallback_metadata: more peers to try on the receive side if the
            first fails: a list of metadata strings or a callable
            ``(src_rank, step) -> list[str]``.
        drain_timeout: how long ``disallow_checkpoint`` waits for in-flight
            readers before cutting them off (default ``timeout``).
        device: RDMA device name override for mooncake.
    """

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=60),
        backend: str = "auto",
        num_streams: int = 4,
        chunk_size: int = 4 << 20,
        host: Optional[str] = None,
        bind_host: str = "",
        state_dict_template: Optional[Callable[[], T]] = None,
        fallback_metadata: Union[None, Sequence[str], Callable[[int, int], Sequence[str]]] = None,
        drain_timeout: Optional[timedelta] = None,
        device: Optional[str] = None,
        _fault: Optional[Dict[str, Any]] = None,
    ) -> None:
        if num_streams < 1 or chunk_size < 1:
            raise ValueError(f"num_streams and chunk_size must be >= 1, got {num_streams}, {chunk_size}")
        self._timeout = timeout
        self._num_streams = num_streams
        self._chunk_size = chunk_size
        self._host = host or os.environ.get("MONARCH_FT_TRANSPORT_HOST") or socket.gethostname()
        self._template = state_dict_template
        self._fallback = fallback_metadata
        self._drain = drain_timeout if drain_timeout is not None else timeout
        self._fault = dict(_fault or {})

        self._backend = _select_backend(backend, self._host, num_streams, device)
        self._tcp_reader = self._backend if isinstance(self._backend, TCPBackend) else TCPBackend(num_streams)

        self._cond = threading.Condition()
        self._staged: Optional[_Staging] = None
        self._allowed = False
        self._gen = 0
        self._inflight = 0
        self._sessions: Dict[int, socket.socket] = {}
        self._busy: Set[socket.socket] = set()
        self._conns: Set[socket.socket] = set()
        self._threads: Set[threading.Thread] = set()
        self._session_ids = itertools.count(1)
        self._closed = False
        self._crc_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mft-crc")
        # (step, state_dict) this rank holds and serves on request until its next disallow.
        self._offer: Optional[tuple] = None
        # What the last recv_checkpoint fetched from whom (receive_report).
        self._last_receive: Dict[str, Any] = {}

        self._listener = listen(bind_host)
        self._port = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="mft-accept", daemon=True)
        self._accept_thread.start()
        logger.info("ShardedTransport serving on %s (backend=%s)", self.metadata(), self.backend_name)

    # ---------------------------------------------------------------- info
    @property
    def backend_name(self) -> str:
        return self._backend.name

    def metadata(self) -> str:
        return format_metadata([Peer(self._host, self._port)])

    # ---------------------------------------------------------------- sender
    def send_checkpoint(self, dst_ranks: List[int], step: int, state_dict: T, timeout: timedelta) -> None:
        """Stages ``state_dict`` for ``step`` and returns; receivers pull it (non-blocking)."""
        self.disallow_checkpoint()
        with self._cond:
            self._gen += 1
            gen = self._gen
        header, views = build_header(state_dict, step, gen, self._chunk_size)
        header.mooncake = self._backend.expose(views)
        staging = _Staging(header, views)
        with self._cond:
            self._staged = staging
            self._allowed = True
            self._cond.notify_all()
        logger.info(
            "staged step=%d gen=%d: %d tensors, %.1f MB in %d chunks for ranks %s",
            step,
            gen,
            len(header.tensors),
            header.total_bytes / 1e6,
            len(header.chunks),
            dst_ranks,
        )

    def offer(self, step: int, state_dict: Callable[[], T]) -> None:
        """This rank holds the committed state of ``step`` until its next ``disallow_checkpoint``.

        TorchFT makes one healthy peer the source of a healing rank and has only that one
        stage its state. When a chunk from it fails its checksum, the receiver asks another
        healthy peer (``fallback_metadata``); that peer serves the state it offered here,
        staged from ``state_dict()`` when the request comes. Only such a request is served from
        an offer: one to TorchFT's source waits for what ``send_checkpoint`` stages. Offer it only while the state
        cannot change: from the step's quorum to its commit vote (TorchFT's Manager calls
        ``disallow_checkpoint`` at every ``should_commit``, which withdraws the offer; staging
        and withdrawing take the same lock, so no request is served a state being stepped).
        """
        with self._cond:
            self._offer = (step, state_dict)
            self._cond.notify_all()

    def _stage_offer(self, step: int) -> None:
        """Under ``_cond``: stage the offered state for a receiver asking for ``step``, if it is that step's."""
        offer = self._offer
        if offer is None or offer[0] != step or self._closed:
            return
        self._offer = None
        self._gen += 1
        header, views = build_header(offer[1](), step, self._gen, self._chunk_size)
        header.mooncake = self._backend.expose(views)
        staging = _Staging(header, views)
        staging.on_demand = True
        self._staged, self._allowed = staging, True
        logger.info("staged step=%d on a receiver's request (offered): %d chunks", step, len(header.chunks))

    def set_test_fault(self, fault: Dict[str, Any]) -> None:
        """A test hook: damage what this transport serves from now on. ``corrupt_chunk``: flip a
        byte of that chunk in flight (the checksum sent with it stays the true one);
        ``sent_only``: only in what ``send_checkpoint`` staged, not in an offer served on request;
        ``times``: disarmed after damaging (or truncating) that many chunks (absent: never)."""
        self._fault = dict(fault)

    def _spend_test_fault(self, fault: Dict[str, Any]) -> None:
        """One damaged chunk of a fault armed for ``times`` of them: the last one disarms it."""
        with self._cond:
            if fault is self._fault and "times" in fault:
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self._fault = {}

    def receive_report(self) -> Dict[str, Any]:
        """What the last ``recv_checkpoint`` fetched: chunks in all, from each peer in the order
        asked, how many were fetched again elsewhere after a failure there, and the failures."""
        return dict(self._last_receive)

    def disallow_checkpoint(self) -> None:
        """Stops serving: drains readers (up to drain_timeout), then cuts the rest off."""
        with self._cond:
            self._offer = None
            if not self._allowed:
                return
            end = time.monotonic() + self._drain.total_seconds()
            while self._sessions and time.monotonic() < end:
                self._cond.wait(max(0.0, end - time.monotonic()))
            if self._sessions:
                logger.warning("disallow_checkpoint: cutting off %d unfinished readers", len(self._sessions))
            self._allowed = False
            for s in list(self._busy) + list(self._sessions.values()):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            while self._inflight:
                self._cond.wait(1.0)
            self._staged = None
        self._backend.unexpose()

    @contextmanager
    def _hold(self, gen: int, step: int) -> Iterator[_Staging]:
        """Pins the staging while a chunk is served; raises if it is no longer served."""
        with self._cond:
            st = self._staged
            if not self._allowed or st is None or st.header.gen != gen:
                raise StaleCheckpointError(f"checkpoint for step {step} is no longer served (disallowed after the step committed)")
            self._inflight += 1
        try:
            yield st
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if self._closed:
                conn.close()
                return
            tune(conn)
            t = threading.Thread(target=self._serve_conn, args=(conn,), name="mft-serve", daemon=True)
            with self._cond:
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _serve_conn(self, conn: socket.socket) -> None:
        session: Optional[int] = None
        try:
            while True:
                try:
                    req = recv_msg(conn, None, "reading a request")
                except (TransportError, OSError):
                    return
                op = req.get("op")
                if op == "header":
                    session = self._op_header(conn, req, session)
                elif op == "chunks":
                    self._op_chunks(conn, req)
                elif op == "checksums":
                    self._op_checksums(conn, req)
                elif op == "done":
                    with self._cond:
                        st = self._staged
                        ok = self._allowed and st is not None and st.header.gen == req["gen"]
                    send_msg(conn, {"ok": ok})
                    self._end_session(session)
                    session = None
                else:
                    send_msg(conn, {"ok": False, "kind": "protocol", "error": f"unknown op {op!r}"})
                    return
        except OSError:
            pass
        except Exception:
            logger.exception("ShardedTransport server error")
        finally:
            self._end_session(session)
            with self._cond:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()

    def _end_session(self, session: Optional[int]) -> None:
        if session is None:
            return
        with self._cond:
            self._sessions.pop(session, None)
            self._cond.notify_all()

    def _op_header(self, conn: socket.socket, req: Dict[str, Any], session: Optional[int]) -> Optional[int]:
        step = req["step"]
        end = time.monotonic() + float(req.get("timeout", self._timeout.total_seconds()))
        with self._cond:
            # The receiver may ask before the healthy rank staged this step: wait, like
            # HTTPTransport.  That includes an *older* step still staged -- the sender has not
            # yet disallowed it and staged the new one (TorchFT's conformance test hits this
            # whenever the receiver's request overtakes the sender's disallow_checkpoint).
            # Only a newer step staged means the request can never be served: stale.
            while not self._closed and not (self._allowed and self._staged is not None and self._staged.header.step >= step):
                if req.get("fallback"):
                    # Asked as another healthy peer, not as TorchFT's source: serve the offer.
                    self._stage_offer(step)
                if self._allowed and self._staged is not None and self._staged.header.step >= step:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            st = self._staged if self._allowed else None
            if st is None or st.header.step < step:
                serving = f"serving step {st.header.step}" if st is not None else "no checkpoint staged"
                send_msg(conn, {"ok": False, "kind": "timeout", "error": f"{serving} (waited for step {step})"})
                return session
            if st.header.step != step:
                send_msg(
                    conn,
                    {"ok": False, "kind": "stale", "error": f"stale step: serving step {st.header.step} but step {step} was requested"},
                )
                return session
            self._end_session(session)
            session = next(self._session_ids)
            self._sessions[session] = conn
        try:
            algo = ck.pick(req.get("checksums", ["crc32"]))
        except ValueError as e:
            send_msg(conn, {"ok": False, "kind": "protocol", "error": str(e)})
            return session
        # per-session copy: concurrent receivers may negotiate different checksums
        header = dataclasses.replace(st.header, session=session, checksum=algo)
        if req.get("backend") == "mooncake" and header.mooncake is not None and algo not in st.crc_future:
            # one-sided readers need our checksums at the end: compute them meanwhile
            st.crc_future[algo] = self._crc_pool.submit(lambda: [st.crc(algo, i) for i in range(len(header.chunks))])
        send_msg(conn, {"ok": True, "header": header})
        return session

    def _op_chunks(self, conn: socket.socket, req: Dict[str, Any]) -> None:
        gen, step, algo = req["gen"], req["step"], req["algo"]
        with self._cond:
            self._busy.add(conn)
        try:
            for cid in req["ids"]:
                try:
                    with self._hold(gen, step) as st:
                        fault = {} if self._fault.get("sent_only") and st.on_demand else self._fault
                        if not 0 <= cid < len(st.header.chunks):
                            raise ProtocolError(f"no chunk {cid}")
                        views = st.chunk_views(cid)
                        nbytes = st.header.chunk_nbytes[cid]
                        wire_step = step + 1 if fault.get("stale_chunk") == cid else step
                        conn.sendall(CHUNK_HDR.pack(CHUNK_MAGIC, 0, cid, wire_step, nbytes, 0))
                        if fault.get("delay_s"):
                            time.sleep(fault["delay_s"])
                        if fault.get("corrupt_chunk") == cid or fault.get("truncate_chunk") == cid:
                            self._spend_test_fault(fault)
                            data = bytearray(b"".join(bytes(v) for v in views))
                            if fault.get("truncate_chunk") == cid:
                                conn.sendall(data[: nbytes // 2])
                                conn.shutdown(socket.SHUT_RDWR)
                                return
                            data[len(data) // 2] ^= 0xFF
                            conn.sendall(data)
                            conn.sendall(CRC_TRAILER.pack(st.crc(algo, cid)))
                            continue
                        cache = st.crcs.setdefault(algo, {})
                        crc = cache.get(cid)
                        running = 0
                        for v in views:
                            for w in range(0, len(v), WINDOW):
                                win = v[w : w + WINDOW]
                                conn.sendall(win)
                                if crc is None:  # checksum while the window is cache-hot
                                    running = ck.update(algo, win, running)
                        if crc is None:
                            crc = cache[cid] = running & 0xFFFFFFFF
                        conn.sendall(CRC_TRAILER.pack(crc))
                except StaleCheckpointError as e:
                    send_error_frame(conn, cid, step, str(e))
                    return
                except ProtocolError as e:
                    send_error_frame(conn, cid, step, str(e))
                    return
        finally:
            with self._cond:
                self._busy.discard(conn)

    def _op_checksums(self, conn: socket.socket, req: Dict[str, Any]) -> None:
        try:
            with self._hold(req["gen"], req["step"]) as st:
                fut = st.crc_future.get(req["algo"])
                if fut is not None:
                    allc = fut.result()
                    crcs = [allc[i] for i in req["ids"]]
                else:
                    crcs = [st.crc(req["algo"], i) for i in req["ids"]]
            send_msg(conn, {"ok": True, "crcs": crcs})
        except StaleCheckpointError as e:
            send_msg(conn, {"ok": False, "kind": "stale", "error": str(e)})

    # ---------------------------------------------------------------- receiver
    def _peers(self, src_rank: int, metadata: str, step: int) -> List[Peer]:
        peers = parse_metadata(metadata)
        extra: Sequence[str] = ()
        if callable(self._fallback):
            extra = self._fallback(src_rank, step)
        elif self._fallback:
            extra = self._fallback
        for m in extra:
            for p in parse_metadata(m):
                if p not in peers:
                    peers.append(p)
        return peers

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Fetches step ``step`` from the peer(s) in ``metadata``; returns only verified state."""
        deadline = Deadline(timeout.total_seconds(), f"recv_checkpoint(step={step}) from rank {src_rank}")
        peers = self._peers(src_rank, metadata, step)
        state = _RecvState()
        failures: List[str] = []
        last: Optional[BaseException] = None
        t0 = time.perf_counter()
        self._last_receive = {"step": step, "peers": [], "failures": failures}
        named = len(parse_metadata(metadata))
        for i, peer in enumerate(peers):
            before = len(state.verified)
            try:
                self._fetch_from(peer, step, deadline, state, fallback=i >= named)
            except (TransportError, OSError) as e:
                last = e
                failures.append(f"{peer}: {e}")
                logger.warning("recv_checkpoint from %s failed: %s", peer, e)
                if isinstance(e, TransferTimeoutError) and deadline.end <= time.monotonic():
                    break
                continue
            finally:
                self._last_receive["peers"].append({"peer": str(peer), "chunks": max(0, len(state.verified) - before)})
            if state.complete():
                h = state.header
                assert h is not None
                dt = time.perf_counter() - t0
                logger.info(
                    "received step=%d: %.1f MB in %.2fs (%.2f GB/s) via %s",
                    step,
                    h.total_bytes / 1e6,
                    dt,
                    h.total_bytes / max(dt, 1e-9) / 1e9,
                    state.backend,
                )
                got = self._last_receive["peers"]
                self._last_receive.update(chunks=len(h.chunks), refetched=sum(p["chunks"] for p in got[1:]))
                return self._assemble(state)
        if len(failures) == 1 and last is not None:
            raise last
        msg = f"recv_checkpoint(step={step}) failed from all {len(peers)} peers: " + "; ".join(failures)
        if isinstance(last, TransferTimeoutError):
            raise TransferTimeoutError(msg)
        raise AllPeersFailedError(msg)

    def _fetch_from(self, peer: Peer, step: int, deadline: Deadline, state: "_RecvState", fallback: bool = False) -> None:
        """Fetch what ``state`` still misses from ``peer`` (``fallback``: a peer of fallback_metadata,
        not one TorchFT named: it serves what it offered, see :meth:`offer`)."""
        ctl = connect(peer, deadline, f"connecting to {peer}")
        try:
            want_mc = not isinstance(self._backend, TCPBackend)
            send_msg(
                ctl,
                {
                    "op": "header",
                    "step": step,
                    "timeout": deadline.remaining("requesting the header"),
                    "checksums": ck.PREFERRED,
                    "backend": "mooncake" if want_mc else "tcp",
                    "fallback": fallback,
                },
            )
            rep = recv_msg(ctl, deadline, f"waiting for the header of step {step} from {peer}")
            if not rep.get("ok"):
                kind, err = rep.get("kind"), f"{peer}: {rep.get('error')}"
                if kind == "stale":
                    raise StaleCheckpointError(err)
                if kind == "timeout":
                    raise TransferTimeoutError(f"{deadline.what} timed out: {err}")
                raise ProtocolError(err)
            header: Header = rep["header"]
            if header.step != step:
                raise StaleCheckpointError(f"{peer} sent header for step {header.step}, expected {step}")
            state.prepare(header, self._template)

            backend: Backend = self._tcp_reader
            if want_mc and header.mooncake is not None:
                backend = self._backend
            state.backend = backend.name
            missing = state.missing()

            def remote_checksums(ids: List[int]) -> List[int]:
                send_msg(ctl, {"op": "checksums", "gen": header.gen, "step": step, "ids": ids, "algo": header.checksum})
                r = recv_msg(ctl, deadline, f"waiting for checksums from {peer}")
                if not r.get("ok"):
                    raise StaleCheckpointError(f"{peer}: {r.get('error')}")
                return r["crcs"]

            result = backend.fetch(peer, header, missing, state.dst, deadline, remote_checksums)
            send_msg(ctl, {"op": "done", "gen": header.gen})
            done = recv_msg(ctl, deadline, f"finishing the transfer with {peer}")
            if not done.get("ok"):
                state.verified.clear()
                raise StaleCheckpointError(f"{peer} stopped serving step {step} during the transfer")
            state.verified |= result.good
            if result.errors:
                errs = result.errors
                timeouts = [e for e in errs if isinstance(e, TransferTimeoutError)]
                raise (timeouts[0] if timeouts else errs[0])
        finally:
            ctl.close()

    def _assemble(self, state: "_RecvState") -> T:
        h = state.header
        assert h is not None
        out: List[Any] = []
        for i, meta in enumerate(h.tensors):
            buf = state.dst[i]
            tpl = state.inplace[i]
            if tpl is not None and state.inplace_exact[i]:
                out.append(tpl)
                continue
            t = torch.as_strided(buf.view(meta.dtype), meta.shape, meta.stride, 0)
            if tpl is not None:  # same dtype/shape, other layout or device: copy in
                local = _local(tpl)
                local.copy_(t)
                out.append(tpl)
                continue
            if meta.dtensor is not None:
                t = _rebuild_dtensor(t, meta.dtensor.spec, state.template_leaves.get(meta.path))
            out.append(t)
        return unflatten(h, out)

    # ---------------------------------------------------------------- shutdown
    def shutdown(self, wait: bool = True) -> None:
        """Closes the listener and every connection, joins threads, unregisters memory."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._allowed = False
            self._staged = None
            self._cond.notify_all()
            conns = list(self._conns)
            threads = list(self._threads)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._tcp_reader.close()
        if wait:
            self._accept_thread.join(timeout=5)
            for t in threads:
                t.join(timeout=5)
        self._crc_pool.shutdown(wait=wait)
        self._backend.close()
        if self._tcp_reader is not self._backend:
            self._tcp_reader.close()


def _is_dtensor(v: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(v, DTensor)


def _rebuild_dtensor(local: torch.Tensor, spec: Any, template_leaf: Any) -> torch.Tensor:
    """Wraps a received local shard back into the DTensor it was sent as.

    With a template DTensor at the same path, the receiver's own mesh is used (it is
    the one its collectives run on); without one, the sender's spec as shipped in the
    header -- built directly from it rather than through ``DTensor.from_local``, which
    would recompute the shard order and so could yield an unequal spec.

    Args:
        local: the received local shard (on CPU).
        spec: the sender's ``DTensorSpec``.
        template_leaf: the template's value at this path, if any.
    """
    from torch.distributed.tensor import DTensor

    if _is_dtensor(template_leaf):
        mesh = template_leaf.device_mesh
        return DTensor.from_local(local.to(mesh.device_type), mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride)
    return DTensor(local.to(spec.mesh.device_type), spec, requires_grad=False)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


class _RecvState:
    """Destination buffers and which chunks are verified, kept across peer retries."""

    def __init__(self) -> None:
        self.header: Optional[Header] = None
        self.dst: List[torch.Tensor] = []
        self.inplace: List[Optional[torch.Tensor]] = []
        self.inplace_exact: List[bool] = []
        self.template_leaves: Dict[str, Any] = {}
        self.verified: Set[int] = set()
        self.backend = "?"

    def complete(self) -> bool:
        return self.header is not None and len(self.verified) == len(self.header.chunks)

    def missing(self) -> List[int]:
        assert self.header is not None
        return [i for i in range(len(self.header.chunks)) if i not in self.verified]

    def prepare(self, header: Header, template: Optional[Callable[[], Any]]) -> None:
        """Allocates destinations from the header, unless a compatible layout is already here."""
        if self.header is not None and self.header.fingerprint == header.fingerprint:
            self.header = header  # same layout: keep verified chunks, retry only the rest
            return
        self.header = header
        self.verified = set()
        self.template_leaves = {}
        if template is not None:
            flat, _ = tree_flatten_with_path(template())
            self.template_leaves = {keystr(p): v for p, v in flat}
        self.dst, self.inplace, self.inplace_exact = [], [], []
        for meta in header.tensors:
            tpl = self.template_leaves.get(meta.path)
            dst, inplace, exact = None, None, False
            if isinstance(tpl, torch.Tensor):
                local = _local(tpl)
                if local.dtype == meta.dtype and tuple(local.shape) == meta.shape:
                    inplace = tpl
                    if (
                        local.device.type == "cpu"
                        and tuple(local.stride()) == meta.stride
                        and span_elems(local) * local.element_size() == meta.nbytes
                        and not local.is_conj()
                        and not local.is_neg()
                    ):
                        dst, exact = byte_view(local.detach(), meta.nbytes), True
            if dst is None:
                dst = torch.empty(meta.nbytes, dtype=torch.uint8)
            self.dst.append(dst)
            self.inplace.append(inplace)
            self.inplace_exact.append(exact)
