"""Faults asked for while the drill runs (``chaos.on_demand``): ``monarch_ft.launch(...).inject``
writes a request (monarch_ft.records.fault_requests); this hook, in the controller, checks it as a
``chaos.faults`` entry is checked and appends it to the injector's queue, or refuses it in one line.
The injector then fires it like any configured fault (after the one before it recovered), and
times it the same way.
"""

from __future__ import annotations

from typing import Any

from chaos.config import DrillConfig, validate_chaos
from chaos.injector import ChaosInjector
from chaos.kinds import parse_fault
from monarch_ft.controller.control import JobControl
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.fault_requests import ACCEPTED, PENDING, REFUSED, requests, settle


def _as_fault(request: dict[str, Any]) -> dict[str, Any]:
    """A request as a ``chaos.faults`` entry: with no ``at_step`` or ``at_s`` it is due now."""
    fault = {k: v for k, v in request.items() if v is not None}
    if "at_step" not in fault and "at_s" not in fault:
        fault["at_s"] = 0.0
    return fault


class FaultRequests:
    """A supervisor hook (before the injector in the hook list) that feeds run-time requests to the injector.

    Args:
        injector: the drill's injector (its ``faults`` queue grows).
        cfg: the drill's config (what a request is checked against).
        run_dir: the run directory (its requests).
    """

    def __init__(self, injector: ChaosInjector, cfg: DrillConfig, run_dir: str) -> None:
        self.injector = injector
        self.cfg = cfg
        self.run_dir = run_dir

    def restore(self) -> None:
        """A controller taking the drill over: the accepted requests join the queue again, in order."""
        for name, request in requests(self.run_dir, ACCEPTED):
            self.injector.faults.append(parse_fault(_as_fault(request), f"fault request {name}"))

    def tick(self, job: JobControl, now: float) -> None:
        """Check each new request: accepted into the queue (``fault_requested``) or refused (``fault_request_refused``).

        Args:
            job: the job's control handle.
            now: the tick's time.
        """
        for name, request in requests(self.run_dir, PENDING):
            try:
                fault = parse_fault(_as_fault(request), f"fault request {name}")
                validate_chaos(self.cfg, [*self.injector.faults, fault])
            except ConfigError as e:
                settle(self.run_dir, name, REFUSED)
                job.emit(EventKind.FAULT_REQUEST_REFUSED, request=name, error=str(e))
                continue
            self.injector.faults.append(fault)
            settle(self.run_dir, name, ACCEPTED)
            job.emit(EventKind.FAULT_REQUESTED, request=name, fault_id=len(self.injector.faults) - 1, kind=fault.kind, target=fault.target)
