"""The drill driver: a supervisor hook that injects the drill's faults one at a time.

A fault fires when its trigger is reached (a committed step, or seconds since training
began) *and* the previous fault has recovered, so each MTTR is measured on its own.
Recovered is :mod:`monarch_ft.records.recovered`'s rule, applied to the step records as the
supervisor relays them (``metrics.jsonl``, read as it grows), so the injector, the drill
report and ``status`` agree. Targets are drawn among healthy groups (running, in the
quorum, not finished), never the last healthy one unless the drill allows it.
"""

from __future__ import annotations

import random
import time
from typing import Optional

from chaos.kinds import FaultOptions, fault_kind
from chaos.outcome import blocked_reason
from chaos.schedule import pick_target
from monarch_ft.controller.control import JobControl
from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import atomic_write_json, read_json
from monarch_ft.records.recovered import Failure, Recovery, recovery
from monarch_ft.records.reports import ReportTail


class ChaosInjector:
    def __init__(
        self,
        faults: list[FaultOptions],
        seed: int,
        allow_last_healthy: bool,
        recovery_timeout_s: float,
        tail_steps: int = 10,
        state_path: Optional[str] = None,
        finish_when_done: bool = True,
    ) -> None:
        # False (chaos.on_demand): faults may still be asked for after the last one; the job
        # trains to training.steps or a stop instead of finishing tail_steps after it.
        self.finish_when_done = finish_when_done
        # Where the injector's progress is kept for a controller that takes the drill over
        # (a controller fault kills the process this injector runs in).
        self.state_path = state_path
        self.started = time.time()
        self.tail_steps = tail_steps
        self._finish_requested = False
        self.faults = faults
        self.rng = random.Random(seed)
        self.allow_last_healthy = allow_last_healthy
        self.recovery_timeout_s = recovery_timeout_s
        self.next_index = 0
        self.active: Optional[dict] = None
        self.injected: list[dict] = []
        # What last held back the next fault (chaos.outcome.NotInjected and its context), by
        # fault index: a fault that never fires is reported with this reason.
        self.blocked: dict[int, dict] = {}
        # The step records relayed since the active fault (rank 0's commits, every rank's
        # state hashes): what the recovery rule reads. A new controller re-reads the file.
        self._metrics: Optional[ReportTail] = None
        self._records: list[dict] = []

    def _due(self, job: JobControl, fault: FaultOptions, now: float) -> bool:
        if fault.wait_standby and job.standby_pending():
            return False
        if fault.at_step is not None:
            return max((r["step"] for r in job.last_commit.values()), default=-1) >= fault.at_step
        return job.first_step_time is not None and now - job.first_step_time >= fault.at_s

    def _read_records(self, job: JobControl) -> None:
        """Keep the step records relayed since the active fault that the rule reads."""
        if self._metrics is None:
            self._metrics = ReportTail(job.run_layout.metrics)
        new = self._metrics.read()
        if self.active is not None:
            since = self.active["injected_at"]
            self._records += [m for m in new if m["time"] >= since and ((m["rank"] == 0 and m.get("committed")) or m.get("state_hash"))]

    def _recovery(self, job: JobControl, active: dict) -> Recovery:
        """The active fault by monarch_ft.records.recovered's rule, on what has been relayed so far."""
        rule = fault_kind(active["kind"]).recovery
        failure = Failure(active["injected_at"], active["target"], active["attempt"], active["step"], frozenset(active["members"]) | {active["target"]})
        events = job.events_of(EventKind.GROUP_LAUNCHED) + (job.events_of(rule.marker) if rule.marker else [])
        return recovery(failure, rule, events, self._records, ranks=job.cfg.ft.ranks_per_group)

    def _save(self) -> None:
        if self.state_path:
            state = {
                "started": self.started,
                "next_index": self.next_index,
                "active": self.active,
                "injected": self.injected,
                "finish_requested": self._finish_requested,
                "rng": repr(self.rng.getstate()),
                # Why a fault was held back: a reattached drill reports a fault that never
                # fired with the reason its first controller saw, not "queued".
                "blocked": {str(i): b for i, b in self.blocked.items()},
            }
            atomic_write_json(self.state_path, state)

    def restore(self) -> None:
        """Continue a drill whose controller was replaced (controller.attach=true)."""
        import ast

        state = read_json(self.state_path) if self.state_path else None
        if not state:
            return
        self.started, self.next_index, self.injected = state["started"], state["next_index"], state["injected"]
        self._finish_requested = state["finish_requested"]
        active = state["active"]
        # The same dict as the last of injected (JSON made two copies).
        self.active = next((f for f in self.injected if active and f["id"] == active["id"]), None)
        self.rng.setstate(ast.literal_eval(state["rng"]))
        self.blocked = {int(i): b for i, b in state.get("blocked", {}).items()}

    def tick(self, job: JobControl, now: float) -> None:
        def progress() -> tuple:
            return (self.next_index, self.active is None, self._finish_requested, self.blocked.get(self.next_index))

        before = progress()
        self._tick(job, now)
        if progress() != before:
            self._save()

    def _hold(self, job: JobControl, reason, **context) -> None:
        self.blocked[self.next_index] = {"reason": reason.value, **context}

    def _tick(self, job: JobControl, now: float) -> None:
        self._read_records(job)
        if self.active is not None and self.next_index < len(self.faults):
            self._hold(job, blocked_reason(self.active["id"], True, True), previous=self.active["id"])
        if self.active is not None:
            found = self._recovery(job, self.active)
            if found.settled(hashes_expected=bool(job.cfg.training.state_hash_every)):
                # The MTTR the report and status show: the rule's, from the records' own times.
                job.emit(
                    EventKind.FAULT_RECOVERED,
                    fault_id=self.active["id"],
                    kind=self.active["kind"],
                    target=self.active["target"],
                    seconds=found.mttr_s,
                    back_at=found.back_at,
                )
                self.active, self._records = None, []
            elif now - self.active["injected_at"] > self.recovery_timeout_s:
                job.emit(EventKind.FAULT_RECOVERY_TIMEOUT, fault_id=self.active["id"], kind=self.active["kind"], target=self.active["target"])
                self.active, self._records = None, []
            return
        if self.next_index >= len(self.faults):
            if self.finish_when_done and not self._finish_requested and job.last_commit:
                # Every fault done: train a few more steps together, then finish cleanly.
                self._finish_requested = True
                job.finish_at(max(r["step"] for r in job.last_commit.values()) + self.tail_steps)
            return
        fault = self.faults[self.next_index]
        if not self._due(job, fault, now):
            self._hold(job, blocked_reason(None, False, True))
            return
        healthy = job.healthy_groups()
        target = pick_target(self.rng, healthy, fault, self.allow_last_healthy)
        if target is None:
            self._hold(job, blocked_reason(None, True, False), healthy=sorted(healthy))
            return
        kind = fault_kind(fault.kind)
        step = job.last_commit[target]["step"]
        injected_at = time.time()
        # A kind that ends this process (the controller) is recorded (event, state) first.
        details = kind.announce(job, target, fault) if kind.ends_this_process else kind.inject(job, target, fault)
        self.active = {
            "id": self.next_index,
            "kind": fault.kind,
            "mode": kind.mode(fault),
            "target": target,
            "rank": fault.rank,
            "attempt": job.attempt(target),
            "at_step": fault.at_step,
            "at_s": fault.at_s,
            "step": step,
            "members": sorted(job.last_commit[target].get("participating_groups") or []),
            "injected_at": injected_at,
        }
        self._records = []
        self.injected.append(self.active)
        job.emit(
            EventKind.FAULT_INJECTED,
            time=injected_at,
            fault_id=self.next_index,
            of=len(self.faults),
            kind=fault.kind,
            target=target,
            rank=fault.rank,
            attempt=job.attempt(target),
            step=step,
            **{"mode": kind.mode(fault), **details},
        )
        self.next_index += 1
        if kind.ends_this_process:
            self._save()
            kind.inject(job, target, fault)
