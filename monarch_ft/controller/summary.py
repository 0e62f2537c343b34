"""How a job ended, as the controller reports it (``summary.json`` and the console's last lines)."""

from __future__ import annotations

from typing import Sequence

from monarch_ft.records.events import GroupStatus, JobStatus


def job_outcome(group_statuses: Sequence[str], regressed: bool) -> JobStatus:
    """How a job ended once every group is done or given up.

    Regressed first (a commit went below the job's step: its weights are suspect whatever
    else happened); completed when every group finished; failed when none did (every group
    gave up: nothing trained to the end, so calling it degraded would hide a dead job);
    degraded when some finished and some gave up.

    Args:
        group_statuses: every group's :class:`GroupStatus`.
        regressed: some commit went back (``step_regression``).
    """
    if regressed:
        return JobStatus.REGRESSED
    if all(s == GroupStatus.DONE for s in group_statuses):
        return JobStatus.COMPLETED
    if not any(s == GroupStatus.DONE for s in group_statuses):
        return JobStatus.FAILED
    return JobStatus.DEGRADED


def rollback_lines(rollbacks: list[dict]) -> list[str]:
    """The console's end-of-job lines for the job's rollbacks: one per distinct rollback, with
    how many times it happened, so a group that crash-loops back to the same checkpoint
    reads as one line with a count, never as the same line again and again."""
    counts: dict[tuple, int] = {}
    for r in rollbacks:
        key = (r["steps_lost"], r["from_step"], r["to_step"], r["reason"])
        counts[key] = counts.get(key, 0) + 1
    lines = []
    for (lost, frm, to, reason), n in counts.items():
        times = f", {n} times" if n > 1 else ""
        lines.append(
            f"the job went back {lost} committed steps: from step {frm} to its checkpoint at step {to}{times} ({reason}: no group held the job's state)"
        )
    return lines
