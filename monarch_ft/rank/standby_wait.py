"""The waiting rank's side of a warm standby: wait for the promotion, or give up once the
controller that could promote it is gone; then become the failed group.

A standby rank builds everything identity-free (``monarch_ft.rank.trainer``), then waits
here for its promotion file (:func:`wait_for_promotion`), which the controller's standby pool
(``monarch_ft.controller.standby_pool``) writes once, whole: a
:class:`~monarch_ft.records.decisions.Promotion`. It then takes the group's identity
(:func:`promoted_spec`) and its CPU priority back
(:func:`monarch_ft.common.cpu_priority.to_foreground`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from monarch_ft.records.decisions import Promotion
from monarch_ft.records.layout import read_json
from monarch_ft.records.lease import heartbeat_time

# How often a waiting standby rank looks for its promotion file: one stat() per poll,
# well under 0.1% of a core, and at most this much added to a recovery.
PROMOTION_POLL_S = 0.02


def promoted_spec(spec: Any, promotion: Promotion) -> Any:
    """The rank's spec as the group it now is (a RankSpec; same store, host and transport)."""
    mine = promotion.ranks[str(spec.rank)]
    return dataclasses.replace(
        spec,
        group=promotion.group,
        attempt=promotion.attempt,
        report_path=mine["report_path"],
        scratch_dir=mine["scratch_dir"],
        start_gate="",
        load_step=None,
        promotion_path="",
    )


# A waiting standby gives up once its controller's heartbeat is this many beats old (at
# least ORPHAN_MIN_S, at most controller.lease_s): nothing could promote it any more.
ORPHAN_BEATS = 10
ORPHAN_MIN_S = 10.0


def orphan_after_s(heartbeat_s: float, lease_s: float) -> float:
    """How stale the controller's heartbeat may get before a waiting standby gives up. Much
    shorter than a training rank's lease: a standby holds no state worth waiting for, only
    an allocation (a Slurm job, cores)."""
    return min(lease_s, max(ORPHAN_MIN_S, ORPHAN_BEATS * heartbeat_s))


def standby_orphaned(beat_time: Optional[float], beat_pid: Optional[int], launched_by: Optional[int], now: float, stale_s: float) -> Optional[str]:
    """Why a waiting standby will never be promoted (its controller is gone), or None.

    Args:
        beat_time: when the controller's heartbeat (RunLayout.controller_heartbeat) was last
            refreshed; None if there is none (then nothing is decided).
        beat_pid: the pid the heartbeat names.
        launched_by: the pid it named when the standby started (its own controller).
        now: the time now.
        stale_s: orphan_after_s.
    """
    if beat_time is None:
        return None
    if launched_by is not None and beat_pid is not None and beat_pid != launched_by:
        # A controller that attached numbers and launches standbys of its own.
        return f"controller {launched_by} was replaced by {beat_pid}"
    if now - beat_time > stale_s:
        return f"no controller heartbeat for {now - beat_time:.0f} s"
    return None


class ControllerWatch:
    """A waiting standby's view of the controller that launched it (looked at once a second).

    Args:
        heartbeat_path: RunLayout.controller_heartbeat.
        stale_s: orphan_after_s.
    """

    def __init__(self, heartbeat_path: str, stale_s: float, check_every_s: float = 1.0) -> None:
        self.path, self.stale_s, self.check_every_s = heartbeat_path, stale_s, check_every_s
        self.launched_by = self._beat()[1]
        self._checked = time.time()

    def _beat(self) -> tuple[Optional[float], Optional[int]]:
        beat = heartbeat_time(self.path)
        if beat is None:
            return None, None
        try:
            return beat, (read_json(self.path) or {}).get("pid")
        except (OSError, ValueError):
            return None, None

    def gone(self) -> Optional[str]:
        now = time.time()
        if now - self._checked < self.check_every_s:
            return None
        self._checked = now
        beat_time, beat_pid = self._beat()
        if self.launched_by is None:
            self.launched_by = beat_pid
        return standby_orphaned(beat_time, beat_pid, self.launched_by, now, self.stale_s)


def wait_for_promotion(path: str, poll_s: float = PROMOTION_POLL_S, orphaned: Optional[Callable[[], Optional[str]]] = None) -> Promotion | str:
    """Block until the supervisor writes ``path`` (atomically), sleeping between looks; or
    return why the controller will never write it (``orphaned()``, e.g. ControllerWatch.gone).

    Besides that, a standby is ended by a signal: the supervisor's stop at the job's end, or
    with its controller (RankLaunch.die_with_controller: PR_SET_PDEATHSIG locally, the job's
    cancellation and the task wrapper with slurm). The heartbeat check covers what those
    cannot: a Slurm standby on another node, or Monarch procs (which outlive a SIGKILLed
    controller), must not hold their allocation until the job's time limit."""
    while True:
        data = read_json(path)
        if data:
            return Promotion.from_record(data)
        reason = orphaned() if orphaned is not None else None
        if reason:
            return reason
        time.sleep(poll_s)
