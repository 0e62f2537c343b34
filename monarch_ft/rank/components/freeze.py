"""A rank that was frozen waits a moment before it asks for its next quorum.

Why: the Lighthouse takes a replica that has not heartbeaten for ``ft.heartbeat_timeout_ms``
(200 ms here) for dead, and a quorum of the replicas it believes alive needs only more than
half of *them* (torchft's ``quorum_compute``, with ``min_replicas``=1). When every group is
held up at once (a whole-job SIGSTOP, a paused VM, a filesystem that blocked every writer,
a host that stopped scheduling them), each one's heartbeats go stale, and whichever wakes
first and asks for a quorum is the only replica the Lighthouse sees alive: it gets a quorum
of itself, at the same step as a peer that got one of its own just before the freeze. Two
quorums commit the same step with different gradients: a split brain (seen in CI at 2ed5fc3:
groups 0 and 1 each committed step 6 alone, the integrity check found them apart two steps
later and rolled the job back 4 steps).

A thread here ticks every ``tick_s`` on the monotonic clock; a gap between two ticks longer
than the heartbeat timeout in which the process used next to no CPU time (under
:data:`FROZEN_CPU_SHARE` of it) means it was not running at all, long enough for the Lighthouse
to drop it. Two other gaps are not freezes, as its heartbeats (the Manager's Rust thread)
went on through them: the main thread holding the GIL on the CPU (a save's pickling, 0.3-0.4 s
every few saves here), and a process starved of CPU by others on its cores (fork servers
importing beside the ranks gave 0.5-0.6 s gaps at a third of a core each). After a freeze the
next quorum request waits until ``settle_s`` after the wake, so that peers woken with it have
heartbeaten again: the Lighthouse sees them alive, refuses a quorum of one, and the group
behind heals from the one ahead (TorchFT's ordinary path).

A request already waiting at the Lighthouse when the freeze began is not the rank's to
hold back; the controller's integrity check (controller.integrity) still catches what that
leaves.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Froze:
    """One freeze this rank woke from.

    Args:
        woke_at: monotonic time of the first tick after it.
        frozen_s: how long no tick ran.
    """

    woke_at: float
    frozen_s: float


# A gap in which the process ran less than this share of the time is a freeze: stopped or
# paused, it runs none; starved on a loaded host, it still gets its share of the cores (a
# third of one with six runnable processes on two cores).
FROZEN_CPU_SHARE = 0.05


def is_freeze(gap_s: float, cpu_s: float, threshold_s: float) -> bool:
    """Whether a gap between two ticks was a freeze.

    Args:
        gap_s: wall seconds between the ticks.
        cpu_s: CPU seconds the process used meanwhile (every thread).
        threshold_s: the heartbeat timeout.
    """
    return gap_s > threshold_s and cpu_s < FROZEN_CPU_SHARE * gap_s


def settle_left(now: float, froze: Optional[Froze], settle_s: float) -> float:
    """Seconds still to wait before a quorum request at ``now`` (monotonic), after ``froze``.

    Args:
        now: the monotonic time now.
        froze: the latest freeze not yet settled; None: none.
        settle_s: how long after a wake a quorum request waits.
    """
    if froze is None:
        return 0.0
    return max(0.0, froze.woke_at + settle_s - now)


class FreezeWatch:
    """Notices that this process was frozen; :meth:`settle` holds the next quorum request back.

    Args:
        threshold_s: a gap between ticks longer than this, spent off the CPU, is a freeze
            (:func:`is_freeze`; ``ft.heartbeat_timeout_ms``).
        settle_s: how long after waking a quorum request waits (twice the heartbeat timeout:
            a peer woken at the same time has heartbeaten by then, on a loaded host too).
        tick_s: seconds between ticks (``ft.heartbeat_interval_ms``).
        clock: the monotonic clock (a fake in unit tests).
        cpu: the process's CPU time, every thread's (a fake in unit tests).
        sleep: how to wait.
        start: start the ticking thread (False in unit tests, which call :meth:`tick`).
    """

    def __init__(
        self,
        threshold_s: float,
        settle_s: float,
        tick_s: float,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        sleep: Callable[[float], None] = time.sleep,
        start: bool = True,
    ) -> None:
        self.threshold_s, self.settle_s, self.tick_s = threshold_s, settle_s, tick_s
        self._clock, self._cpu, self._sleep = clock, cpu, sleep
        self._last, self._last_cpu = clock(), cpu()
        self._froze: Optional[Froze] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if start:
            self._thread = threading.Thread(target=self._run, name="mft-freeze-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()

    def tick(self) -> None:
        """One tick: a gap since the last one beyond the threshold, mostly off the CPU, is a freeze."""
        with self._lock:  # the thread and settle() both tick
            now, cpu = self._clock(), self._cpu()
            gap, self._last = now - self._last, now
            ran, self._last_cpu = cpu - self._last_cpu, cpu
            if is_freeze(gap, ran, self.threshold_s):
                self._froze = Froze(now, gap)

    def settle(self) -> Optional[tuple[Froze, float]]:
        """Before a quorum request: wait out what is left of the settle time after the latest
        freeze; returns (that freeze, seconds waited), or None when there was none since the
        last call."""
        self.tick()  # a freeze that ended just now, before the thread's next tick
        with self._lock:
            froze, self._froze = self._froze, None
        if froze is None:
            return None
        left = settle_left(self._clock(), froze, self.settle_s)
        if left > 0:
            self._sleep(left)
            with self._lock:
                self._last, self._last_cpu = max(self._last, self._clock()), self._cpu()  # our own wait is no freeze
        return froze, left

    def close(self) -> None:
        self._stop.set()
