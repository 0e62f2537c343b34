"""The rank's side of the lease on its controller: a job nobody supervises ends itself, cleanly.

The ranks do not die with the controller (``monarch_ft.controller.takeover``), so a job whose
controller is gone for good must not run forever. A rank that sees no fresh heartbeat for
``controller.lease_s`` (or a ``python -m monarch_ft stop`` request while no controller
answers it; the rules: :mod:`monarch_ft.records.lease`) ends the job:

- a group that finished its steps and only holds the job open for the others stops
  holding (it leaves the quorum at once);
- a training group finishes at a common step (the first rank to notice writes
  ``control/stop_at_step``, first writer wins, so every group reads the same number),
  saves its checkpoint there as at the end of a job, and exits 0;
- a relaunched group still waiting at its gate has no state of its own: it just exits.
"""

from __future__ import annotations

import os
from typing import Callable

from monarch_ft.records.events import EventKind
from monarch_ft.records.lease import LeaseWatch, finish_at


class ControllerLease(LeaseWatch):
    """A rank's view of the controller's heartbeat (:class:`LeaseWatch`), and what the rank
    does once the job is left to end by itself."""

    def __init__(self, heartbeat_path: str, stop_path: str, lease_s: float, heartbeat_s: float = 1.0, check_every_s: float = 0.5) -> None:
        super().__init__(heartbeat_path, stop_path, lease_s, heartbeat_s, check_every_s)
        self._noticed = False

    def exit_at_gate(self, report: Callable[..., None], step: int) -> None:
        """A relaunched group waiting at its gate, which no controller will open: it has no
        state of its own to save, so it just exits 0."""
        if self.ended():
            report(EventKind.CONTROLLER_LEASE_ENDED, reason=self.ended(), step=step, at="gate")
            os._exit(0)

    def finish_if_ended(self, report: Callable[..., None], stop_at_path: str, step: int, done: bool) -> None:
        """In the step loop: once ended, every training group finishes at one common step
        (first writer wins) and saves its checkpoint there (the end of a job's steps)."""
        if self.ended() and not done and not self._noticed:
            self._noticed = True
            report(EventKind.CONTROLLER_LEASE_ENDED, reason=self.ended(), step=step, finish_at=finish_at(stop_at_path, step))
