"""The controller's end of the link probe: time a fixed payload to and from each rank.

Why: one group's slow link lengthens every group's cross-group collective alike (a ring
allreduce waits for its slowest link), so step timings cannot say whose link is slow
(monarch_ft.controller.stragglers). Production fail-slow detectors localise such a link
actively; this does it with :data:`~monarch_ft.controller.stragglers.PROBE_BYTES` each way to
each rank's probe server (monarch_ft.rank.link_probe, on the address the rank's peers reach it
at), one rank at a time so that probes never compete with each other for a link or for this
process. Each way is timed twice and the faster kept (a busy machine delays a single transfer
now and then; a slow link delays both), and so is an empty request's round trip, which waits for
the rank's probe thread as the transfers do but not for the link (LinkProbe.seconds nets it out).

A round runs in a thread of its own (a slow link takes a while; the watch loop does not wait):
:meth:`LinkProber.start` it, :meth:`LinkProber.take` it once done. What a round means is the
pure rule's (stragglers.find_link_stragglers); when one runs, stragglers.probe_due says.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from monarch_ft.controller.stragglers import PROBE_BYTES, LinkProbe, ProbeReason
from monarch_ft.records.probe_wire import ACK, ProbeOp, pack

# Seconds one rank's probe may take in all (connect and four transfers); a link so slow that it
# runs out gets this as its figure (a lower bound, and slow enough to name).
RANK_TIMEOUT_S = 8.0
# Each way timed this many times; the fastest counts.
TRIES = 2


@dataclass
class ProbeRound:
    """One round: why it ran, the job's step then, when, how long it took, each answering
    rank's figures and the ranks that did not answer (no server, refused, gone)."""

    reason: ProbeReason
    step: int
    started: float
    took_s: float = 0.0
    probes: list[LinkProbe] = field(default_factory=list)
    unanswered: list[tuple[int, int]] = field(default_factory=list)

    def fields(self) -> dict:
        """The ``link_probed`` event's fields."""
        return {
            "reason": self.reason.value,
            "step": self.step,
            "took_s": round(self.took_s, 3),
            "probe_bytes": PROBE_BYTES,
            "ranks": [
                {"group": p.group, "rank": p.rank, "to_rank_s": round(p.to_rank_s, 4), "from_rank_s": round(p.from_rank_s, 4), "rtt_s": round(p.rtt_s, 4)}
                for p in self.probes
            ],
            "unanswered": [list(k) for k in self.unanswered],
        }


def _parse(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _recv_exactly(sock: socket.socket, n: int, buf: memoryview) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(buf[got:n], n - got)
        if k == 0:
            raise ConnectionError("the probe server closed the connection")
        got += k


def _timed(sock: socket.socket, deadline: float, request: bytes, reply: int, buf: memoryview) -> float:
    """Seconds from sending ``request`` to the last of ``reply`` bytes back."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    t0 = time.monotonic()
    sock.sendall(request)
    _recv_exactly(sock, reply, buf)
    return time.monotonic() - t0


def time_link(address: str, payload: bytes, tries: int = TRIES, timeout_s: float = RANK_TIMEOUT_S) -> tuple[float, float, float]:
    """Seconds for ``payload`` to the server at ``address`` (until its acknowledgement) and from
    it (until its last byte), and for an empty request's round trip just before them, each the
    fastest of ``tries``. A transfer cut off by the timeout counts as ``timeout_s`` (and the round
    trip, if none completed, as 0); OSError if the server cannot be reached at all."""
    deadline = time.monotonic() + timeout_s
    size = len(payload)
    buf = memoryview(bytearray(size))
    to_rank, from_rank, rtt = float("inf"), float("inf"), float("inf")
    with socket.create_connection(_parse(address), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        try:
            for _ in range(tries):
                rtt = min(rtt, _timed(sock, deadline, pack(ProbeOp.TO_RANK, 0), len(ACK), buf))
                to_rank = min(to_rank, _timed(sock, deadline, pack(ProbeOp.TO_RANK, size) + payload, len(ACK), buf))
                from_rank = min(from_rank, _timed(sock, deadline, pack(ProbeOp.FROM_RANK, size), size, buf))
        except socket.timeout:
            # Slower than the whole budget: what is known is that it took at least that long.
            to_rank = to_rank if to_rank != float("inf") else timeout_s
            from_rank = from_rank if from_rank != float("inf") else timeout_s
            rtt = rtt if rtt != float("inf") else 0.0
    return to_rank, from_rank, rtt


class LinkProber:
    """Runs probe rounds, one at a time, each in a thread of its own.

    Args:
        payload_bytes: bytes timed each way per rank.
    """

    def __init__(self, payload_bytes: int = PROBE_BYTES) -> None:
        self._payload = bytes(payload_bytes)
        self._thread: Optional[threading.Thread] = None
        self._done: Optional[ProbeRound] = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, targets: dict[tuple[int, int], str], reason: ProbeReason, step: int) -> bool:
        """Probe ``targets`` ((group, rank) -> ``host:port``) in turn; False if a round is still running."""
        if self.busy:
            return False
        rnd = ProbeRound(reason, step, time.time())

        def run() -> None:
            t0 = time.monotonic()
            for (group, rank), address in sorted(targets.items()):
                try:
                    to_rank, from_rank, rtt = time_link(address, self._payload)
                except (OSError, ValueError):
                    rnd.unanswered.append((group, rank))
                    continue
                rnd.probes.append(LinkProbe(group, rank, to_rank, from_rank, rtt))
            rnd.took_s = time.monotonic() - t0
            with self._lock:
                self._done = rnd

        self._thread = threading.Thread(target=run, name="link-prober", daemon=True)
        self._thread.start()
        return True

    def take(self) -> Optional[ProbeRound]:
        """The round that finished since the last call, or None."""
        with self._lock:
            done, self._done = self._done, None
        return done
