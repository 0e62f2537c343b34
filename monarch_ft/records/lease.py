"""The rules of the ranks' lease on their controller, shared by everyone who reads it.

The live controller rewrites ``control/controller`` every ``controller.heartbeat_s``
(``monarch_ft.controller.takeover``); with no fresh heartbeat for ``controller.lease_s``,
or a ``python -m monarch_ft stop`` nobody answers, the job ends itself
(``monarch_ft.rank.components.lease`` says how a rank does it). The Lighthouse guard
(``monarch_ft.controller.lighthouse_guard``), a waiting standby and ``python -m monarch_ft``
read the same heartbeat, so the rules live here, in one place: :func:`lease_expired`,
:func:`stop_unanswered`, :func:`finish_at`, and :class:`LeaseWatch`, which applies them.

Light on purpose (no torch, no Hydra): the Lighthouse guard imports it.
"""

from __future__ import annotations

import math
import os
import time
from typing import Optional

from monarch_ft.records.layout import atomic_write, read_int

# Steps past the one a rank is at when it notices: every group, at most a step apart in
# a quorum, reads the file before it gets there.
FINISH_MARGIN = 2
# The controller's view of the job's step lags the ranks by its report relay's delay (a watch
# tick, a record not yet flushed): a ``stop`` asks this many seconds of steps ahead of it, too.
FINISH_LEAD_S = 1.0
# The most steps that lead may add (a learned step time of microseconds is not a job's pace).
FINISH_LEAD_MAX = 500


def controller_finish_margin(step_s: Optional[float]) -> int:
    """Steps ahead of its own view of the job's step that the controller asks every group to
    finish (a ``stop``): :data:`FINISH_MARGIN` plus :data:`FINISH_LEAD_S` of steps at ``step_s``
    seconds a step (the ranks' learned compute time: an underestimate of a step, so the lead
    errs long). Two steps alone were once fewer than the view lagged by: a group trained the
    very step asked for while the number landed (CI at cd3a267; the rank now saves such a step
    after it, rank.trainer.Trainer.save_final). A finish that lands late is still safe (in hsdp
    the groups of a quorum agree on it and end on one step past it, rank.trainer.StopAt); the
    lead makes the job end where it was asked to.

    Args:
        step_s: seconds a step takes (None: not learned yet; the fixed margin alone).
    """
    if not step_s or step_s <= 0:
        return FINISH_MARGIN
    return FINISH_MARGIN + min(FINISH_LEAD_MAX, math.ceil(FINISH_LEAD_S / step_s))


def heartbeat_time(path: str) -> Optional[float]:
    """When the controller last refreshed its heartbeat (the file's mtime), or None."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def lease_expired(last_beat: Optional[float], now: float, lease_s: float) -> bool:
    """No controller has been seen for ``lease_s``. No heartbeat file at all is not an
    expired lease (the controller writes it before it launches anything)."""
    return last_beat is not None and now - last_beat > lease_s


def stop_unanswered(stop_requested: bool, last_beat: Optional[float], now: float, heartbeat_s: float) -> bool:
    """A stop was asked for and no controller is there to carry it out (its heartbeat is
    three beats old): the ranks carry it out themselves."""
    return stop_requested and (last_beat is None or now - last_beat > 3 * heartbeat_s)


def finish_at(stop_at_path: str, step: int) -> int:
    """Ask every group to finish at ``step + FINISH_MARGIN`` unless some rank (or the
    controller) already named a step; returns the step in force. First writer wins
    (a hard link cannot replace an existing file), so all groups agree."""
    target = step + FINISH_MARGIN
    tmp = f"{stop_at_path}.lease.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(target))
    try:
        os.link(tmp, stop_at_path)
    except FileExistsError:
        target = read_int(stop_at_path, target)
    finally:
        os.remove(tmp)
    return target


def lower_finish(stop_at_path: str, step: int) -> int:
    """The controller's request that every group finish at ``step``: written unless a step no
    later is already in force, so the file's number only ever comes down (a ``stop`` during a
    drill that asked for a later finish finishes now). Ranks re-read it every step and keep
    the lowest they saw, and the groups of a quorum agree on it through their step's
    collective (rank.trainer.StopAt), so every group ends on one step: this one when it lands
    ahead of them (the controller asks ``controller_finish_margin`` ahead of its view), the
    first after it the quorum could agree on when it lands late. One writer only: the
    controller (the ranks' own :func:`finish_at` runs only when no controller is there).
    Returns the step in force."""
    current = read_int(stop_at_path, -1)
    if 0 <= current <= step:
        return current
    atomic_write(stop_at_path, str(step))
    return step


class LeaseWatch:
    """A view of the controller's heartbeat: has the job been left to end by itself?

    Args:
        heartbeat_path: ``RunLayout.controller_heartbeat``.
        stop_path: ``RunLayout.stop_request``.
        lease_s: ``controller.lease_s``.
        heartbeat_s: ``controller.heartbeat_s``.
        check_every_s: the files are looked at no more often than this.
    """

    def __init__(self, heartbeat_path: str, stop_path: str, lease_s: float, heartbeat_s: float = 1.0, check_every_s: float = 0.5) -> None:
        self.heartbeat_path, self.stop_path = heartbeat_path, stop_path
        self.lease_s, self.heartbeat_s, self.check_every_s = lease_s, heartbeat_s, check_every_s
        self._checked = 0.0
        self._ended: Optional[str] = None

    def ended(self) -> Optional[str]:
        """Why the job must end without its controller ("lease_expired", "stop_requested"), or None.
        Once ended, it stays ended."""
        now = time.time()
        if self._ended is None and now - self._checked >= self.check_every_s:
            self._checked = now
            beat = heartbeat_time(self.heartbeat_path)
            if lease_expired(beat, now, self.lease_s):
                self._ended = "lease_expired"
            elif stop_unanswered(os.path.exists(self.stop_path), beat, now, self.heartbeat_s):
                self._ended = "stop_requested"
        return self._ended
