"""The ranks' lease on their controller: a job nobody supervises ends itself, cleanly.

The ranks no longer die with the supervisor (monarch_ft/controller.py), so a job whose
controller is gone for good must not run forever. The live controller rewrites
``control/controller`` every ``controller.heartbeat_s``; a rank that sees no fresh
heartbeat for ``controller.lease_s`` (or a ``python -m monarch_ft stop`` request while
no controller answers it) ends the job:

- a group that finished its steps and only holds the job open for the others stops
  holding (it leaves the quorum at once);
- a training group finishes at a common step (the first rank to notice writes
  ``control/stop_at_step``, first writer wins, so every group reads the same number),
  saves its checkpoint there as at the end of a job, and exits 0;
- a relaunched group still waiting at its gate has no state of its own: it just exits.

This module is light on purpose (no torch, no Hydra): the Lighthouse guard imports it.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from monarch_ft.run_layout import read_int

# Steps past the one a rank is at when it notices: every group, at most a step apart in
# a quorum, reads the file before it gets there.
FINISH_MARGIN = 2


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


class ControllerLease:
    """A rank's (or the Lighthouse guard's) view of the controller's heartbeat.

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
        self._noticed = False

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

    def exit_at_gate(self, report: Callable[..., None], step: int) -> None:
        """A relaunched group waiting at its gate, which no controller will open: it has no
        state of its own to save, so it just exits 0."""
        if self.ended():
            report("controller_lease_ended", reason=self.ended(), step=step, at="gate")
            os._exit(0)

    def finish_if_ended(self, report: Callable[..., None], stop_at_path: str, step: int, done: bool) -> None:
        """In the step loop: once ended, every training group finishes at one common step
        (first writer wins) and saves its checkpoint there (the end of a job's steps)."""
        if self.ended() and not done and not self._noticed:
            self._noticed = True
            report("controller_lease_ended", reason=self.ended(), step=step, finish_at=finish_at(stop_at_path, step))


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
