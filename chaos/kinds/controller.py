"""``controller``: SIGKILL the supervisor itself; after ``delay_s`` a new controller takes the job over.

The injector runs inside the supervisor, so the drill's watchdog (chaos/watchdog.py, a
separate process) does the kill on request and then attaches a new controller
(controller.attach=true). No group is touched and the steps never stop: the fault is
recovered once the new controller is attached (its MTTR clock stops there) and the target
commits with the others after it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from chaos.kinds.base import ControlPlaneFault, FaultOptions
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.recovered import CONTROLLER_REPLACED


@dataclass
class ControllerOptions(FaultOptions):
    delay_s: float = 5.0
    """Seconds the job runs unsupervised before the watchdog attaches a new controller (below ``controller.lease_s``)."""

    kill_rank_unsupervised: bool = False
    """Also SIGKILL rank ``rank`` of the target group while no controller is attached (the watchdog
    does it halfway through ``delay_s``); the new controller restarts it."""

    def check(self, where: str) -> None:
        if self.delay_s < 0:
            raise ConfigError(f"{where}.delay_s={self.delay_s}: must be >= 0 (seconds the job runs without a controller)")


class Controller(ControlPlaneFault):
    name = "controller"
    options = ControllerOptions
    recovery = CONTROLLER_REPLACED
    detected_by = EventKind.CONTROLLER_ATTACHED  # its loss is seen by the next controller
    ends_this_process = True

    def check(self, fault, cfg, traits, where: str) -> None:
        super().check(fault, cfg, traits, where)
        if fault.delay_s >= cfg.controller.lease_s:
            raise ConfigError(
                f"{where}.delay_s={fault.delay_s} reaches controller.lease_s={cfg.controller.lease_s}: the ranks would end the job "
                "before the new controller attaches; lower delay_s or raise controller.lease_s"
            )
        from monarch_ft.launcher import launcher_class

        problem = launcher_class(cfg.launcher.name).adoption_problem()
        if problem:
            raise ConfigError(f"{where}.kind=controller: {problem}")

    def announce(self, job, group: int, fault) -> dict[str, Any]:
        return {"delay_s": fault.delay_s, "pid": os.getpid(), "signal": "SIGKILL", "by": "watchdog", "kill_rank_unsupervised": fault.kill_rank_unsupervised}

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        from chaos.watchdog import request_controller_kill

        rank = (group, fault.rank) if fault.kill_rank_unsupervised else None
        return request_controller_kill(job.run_layout, fault.delay_s, rank)


KIND = Controller()
