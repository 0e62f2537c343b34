"""Goodput and ETTR: the one definition the drill report and the goodput bench share.

Both read the step records in ``metrics.jsonl`` (one per rank per step; monarch_ft.records.reports).

- A **committed group-step** is a rank-0 step record with ``committed`` true whose group is among the
  step's ``participating_groups``: that group's batch went into a committed update. A group that
  committed while only healing, or a step nobody committed, counts for nothing.
- **Goodput** is committed group-steps per second of wall time over a window; the window starts at a
  commit (which is not counted: it is the clock's origin) or at a given time.
- The **goodput ratio** divides it by the fault-free rate measured in the same run (the drill: before
  its first fault; the bench: a fault-free cell), so machine speed and load cancel out.
- **ETTR** (effective training time ratio) is the share of the window's group-seconds spent in
  committed steps: the committed group-steps' ``step_time_s`` summed, over groups x window seconds.
  It is 1 only if every group stepped back to back and every step counted; unlike the ratio it needs
  no fault-free baseline, but it also counts the gaps between steps (data, records) as lost.

Pure functions of the records, so that fast tests pin them on recorded fixtures
(tests/unit/test_goodput.py) and the two users cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


def group_commits(metrics: Iterable[dict], start: Optional[float] = None, end: Optional[float] = None) -> list[dict]:
    """The committed group-steps (see the module doc) with ``start < time <= end``, by time.

    ``start``/``end`` None: unbounded on that side."""
    return sorted(
        (
            m
            for m in metrics
            if m.get("rank") == 0
            and m.get("committed")
            and m.get("group") in (m.get("participating_groups") or ())
            and (start is None or m["time"] > start)
            and (end is None or m["time"] <= end)
        ),
        key=lambda m: m["time"],
    )


@dataclass(frozen=True)
class Goodput:
    """Goodput over one window.

    Args:
        start, end: the window (seconds since the epoch).
        group_steps: committed group-steps in it.
        groups: the replica groups the job runs (ETTR's denominator).
        step_seconds: the committed group-steps' ``step_time_s``, summed.
    """

    start: float
    end: float
    group_steps: int
    groups: int
    step_seconds: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def rate(self) -> Optional[float]:
        """Committed group-steps per second; None for an empty window."""
        return self.group_steps / self.seconds if self.seconds > 0 else None

    @property
    def ettr(self) -> Optional[float]:
        """The share of the window's group-seconds spent in committed steps."""
        return min(1.0, self.step_seconds / (self.groups * self.seconds)) if self.seconds > 0 and self.groups > 0 else None


def goodput(metrics: Iterable[dict], groups: int, start: Optional[float] = None, end: Optional[float] = None) -> Optional[Goodput]:
    """Goodput of the committed group-steps between ``start`` and ``end``.

    ``start`` None: from the first committed group-step (not counted); ``end`` None: to the last
    one. None when that leaves no window (fewer than two commits, or none after ``start``)."""
    commits = group_commits(metrics, None, end)
    if start is None:
        if len(commits) < 2:
            return None
        start = commits[0]["time"]
    inside = [m for m in commits if m["time"] > start]
    if end is None:
        if not inside:
            return None
        end = inside[-1]["time"]
    if end <= start:
        return None
    return Goodput(start, end, len(inside), groups, sum(float(m.get("step_time_s") or 0.0) for m in inside))


def goodput_ratio(rate: Optional[float], fault_free_rate: Optional[float]) -> Optional[float]:
    """Goodput over the fault-free rate of the same run; None if either is unknown (or the baseline is 0)."""
    if rate is None or not fault_free_rate:
        return None
    return rate / fault_free_rate
