"""Faults asked for while a drill runs (chaos.on_demand; monarch_ft.records.fault_requests,
chaos.requests): accepted into the injector's queue, refused in one line, rebuilt by a takeover."""

from __future__ import annotations

import os

from chaos.config import ChaosConfig, DrillConfig
from chaos.injector import ChaosInjector
from chaos.requests import FaultRequests
from monarch_ft.records.fault_requests import ACCEPTED, REFUSED, request_fault, requests


class _Job:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict]] = []

    def emit(self, _event, **fields) -> None:
        self.emitted.append((str(_event), fields))


def test_requests_are_queued_refused_and_rebuilt(tmp_path):
    run = str(tmp_path)
    cfg = DrillConfig(chaos=ChaosConfig(on_demand=True))
    injector = ChaosInjector([], seed=0, allow_last_healthy=False, recovery_timeout_s=60, finish_when_done=False)
    hook, job = FaultRequests(injector, cfg, run), _Job()
    request_fault(run, {"kind": "process_kill", "target": 1})
    request_fault(run, {"kind": "no_such_kind"})
    request_fault(run, {"kind": "hang", "target": 5})
    hook.tick(job, 0.0)
    assert [(f.kind, f.target, f.at_s) for f in injector.faults] == [("process_kill", 1, 0.0)], "due now: at_s=0"
    assert job.emitted[0] == ("fault_requested", {"request": "00000", "fault_id": 0, "kind": "process_kill", "target": 1})
    refused = [fields for kind, fields in job.emitted if kind == "fault_request_refused"]
    assert [r["request"] for r in refused] == ["00001", "00002"]
    assert "no_such_kind" in refused[0]["error"] and "target=5: no such group" in refused[1]["error"]
    assert [n for n, _ in requests(run, ACCEPTED)] == ["00000"] and len(requests(run, REFUSED)) == 2
    hook.tick(job, 1.0)
    assert len(injector.faults) == 1, "a request is read once"
    # A controller taking the drill over: its configured faults, then the accepted requests in order.
    again = ChaosInjector([], seed=0, allow_last_healthy=False, recovery_timeout_s=60, finish_when_done=False)
    FaultRequests(again, cfg, run).restore()
    assert [(f.kind, f.target) for f in again.faults] == [("process_kill", 1)]
    assert request_fault(run, {"kind": "node"}) == "00003" and os.path.exists(os.path.join(run, "control", "fault_requests", "00003.json"))
