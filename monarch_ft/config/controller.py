"""``controller``: the controller's life apart from the job's (attach, detach, the lease)."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.records.errors import require


@dataclass
class ControllerConfig:
    """The controller (supervisor) and the job are separate lives (monarch_ft/controller/takeover.py).

    The ranks and the Lighthouse no longer die with the supervisor: a supervisor that is
    killed, or detached (SIGUSR2), leaves the job training, and a new one takes it over.
    """

    attach: bool = False
    """Take over the job already running in ``hydra.run.dir`` (its ranks, Lighthouse, report
    offsets and counters, from controller.json) instead of starting a new one. The saved job
    config wins over the command line's, except for this section."""

    lease_s: float = 600.0
    """Seconds ranks go without a controller's heartbeat before they end the job by themselves:
    finished groups stop holding it open, the others finish at a common step, save a checkpoint
    there and exit 0 (and the Lighthouse follows). 600 s: long enough for a laptop lid or a
    controller restart, short enough that an abandoned job does not hold its machines for long."""

    heartbeat_s: float = 1.0
    """Seconds between two refreshes of the controller's heartbeat (``control/controller``), which the lease reads."""

    def check(self) -> None:
        """What the types cannot say about this section (one line naming the fix)."""
        require(
            self.heartbeat_s > 0 and self.lease_s > 2 * self.heartbeat_s,
            f"controller.lease_s={self.lease_s} must exceed twice controller.heartbeat_s={self.heartbeat_s} (and both be > 0)",
        )
