"""The job's committed steps per second and the time left, from (time, committed step) samples.

One rule for everything that shows a rate: the console's progress line and the Prometheus
endpoint (each samples the job's committed step when it looks, and keeps its own window).
"""

from __future__ import annotations

from collections import deque
from typing import Optional


class StepRate:
    """Committed steps per second over the last ``window_s`` seconds of samples.

    Why a window and not the whole run: the rate after a fault, or once warm standbys stop
    building, is what the time left depends on; the start-up (imports, the first quorum) would
    weigh on a whole-run mean for long.

    Args:
        window_s: how far back the rate looks.
    """

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def observe(self, now: float, step: int) -> None:
        """Add a sample: the job's committed step at ``now``.

        Args:
            now: the sample's time (seconds).
            step: the job's committed step then (steps committed so far).
        """
        self._samples.append((now, step))
        # Keep one sample at or before the window's start, so the window is always spanned.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def rate(self) -> Optional[float]:
        """Steps per second across the window; None before two samples a moment apart or before the first commit."""
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if t1 - t0 < 1e-3 or s1 <= 0:
            return None
        return max(0, s1 - s0) / (t1 - t0)

    def eta_s(self, steps_left: int) -> Optional[float]:
        """Seconds until ``steps_left`` more steps commit at the current rate; None with no rate (or a stall).

        Args:
            steps_left: steps still to commit.
        """
        rate = self.rate()
        if steps_left <= 0:
            return 0.0
        return steps_left / rate if rate else None
