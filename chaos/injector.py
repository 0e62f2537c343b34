"""The drill driver: a supervisor hook that injects the drill's faults.

By default one at a time: a fault fires when its trigger is reached (a committed step, or
seconds since training began) *and* the previous fault has recovered, so each MTTR is measured
on its own; targets are drawn among healthy groups (running, in the quorum, not finished),
never the last healthy one unless the drill allows it. With ``chaos.overlap`` every fault fires
when its trigger comes, whatever is still recovering, on any group whose ranks run (the goodput
bench: a schedule of faults is the rate applied only if nothing holds a fault back).
Recovered is :mod:`monarch_ft.records.recovered`'s rule, applied to the step records as the
supervisor relays them (``metrics.jsonl``, read as it grows), so the injector, the drill
report and ``status`` agree.
"""

from __future__ import annotations

import os
import random
import time
from typing import Optional

from chaos.kinds import FaultOptions, fault_kind
from chaos.outcome import NotInjected, blocked_reason
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
        overlap: bool = False,
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
        # Injected and not yet recovered (nor timed out): at most one unless ``overlap``.
        self.actives: list[dict] = []
        self.overlap = overlap
        self.injected: list[dict] = []
        # What last held back the next fault (chaos.outcome.NotInjected and its context), by
        # fault index: a fault that never fires is reported with this reason.
        self.blocked: dict[int, dict] = {}
        # The step records relayed since the oldest active fault (rank 0's commits, every rank's
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
        if self.actives:
            since = min(a["injected_at"] for a in self.actives)
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
                "actives": [a["id"] for a in self.actives],
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
        # The same dicts as in injected (JSON made copies).
        self.actives = [f for f in self.injected if f["id"] in set(state["actives"])]
        self.rng.setstate(ast.literal_eval(state["rng"]))
        self.blocked = {int(i): b for i, b in state.get("blocked", {}).items()}

    def tick(self, job: JobControl, now: float) -> None:
        def progress() -> tuple:
            return (self.next_index, len(self.actives), self._finish_requested, self.blocked.get(self.next_index))

        before = progress()
        self._tick(job, now)
        if progress() != before:
            self._save()

    def _hold(self, job: JobControl, reason, **context) -> None:
        self.blocked[self.next_index] = {"reason": reason.value, **context}

    def _settle(self, job: JobControl, now: float) -> bool:
        """Retire the active faults that recovered or timed out; True if any did."""
        done = False
        for active in list(self.actives):
            found = self._recovery(job, active)
            if found.settled(hashes_expected=bool(job.cfg.training.state_hash_every)):
                # The MTTR the report and status show: the rule's, from the records' own times.
                job.emit(
                    EventKind.FAULT_RECOVERED,
                    fault_id=active["id"],
                    kind=active["kind"],
                    target=active["target"],
                    seconds=found.mttr_s,
                    back_at=found.back_at,
                )
            elif now - active["injected_at"] > self.recovery_timeout_s:
                job.emit(EventKind.FAULT_RECOVERY_TIMEOUT, fault_id=active["id"], kind=active["kind"], target=active["target"])
            else:
                continue
            self.actives.remove(active)
            done = True
        if not self.actives:
            self._records = []
        return done

    def _targets(self, job: JobControl) -> list[int]:
        """The groups the next fault may hit: the healthy ones, or (``overlap``) any whose ranks
        run, with the last healthy one left out unless the drill allows it."""
        healthy = job.healthy_groups()
        if not self.overlap:
            return healthy
        live = job.live_groups()
        if not self.allow_last_healthy and len(healthy) == 1:
            live = [g for g in live if g != healthy[0]]
        return live

    def _tick(self, job: JobControl, now: float) -> None:
        self._read_records(job)
        if self.actives and not self.overlap:
            if self.next_index < len(self.faults):
                self._hold(job, blocked_reason(self.actives[0]["id"], True, True), previous=self.actives[0]["id"])
            self._settle(job, now)
            return
        if self.actives:
            self._settle(job, now)
        if self.next_index >= len(self.faults):
            if self.finish_when_done and not self.actives and not self._finish_requested and job.last_commit:
                # Every fault done: train a few more steps together, then finish cleanly.
                self._finish_requested = True
                job.finish_at(max(r["step"] for r in job.last_commit.values()) + self.tail_steps)
            return
        fault = self.faults[self.next_index]
        if os.path.exists(job.run_layout.stop_request):
            # The job is finishing at a common step: a fault now would only be cut off by the end
            # (the goodput bench stops its cells; a fault due after the stop is outside the cell).
            self._hold(job, NotInjected.JOB_STOPPING)
            return
        if not self._due(job, fault, now):
            self._hold(job, blocked_reason(None, False, True))
            return
        targets = self._targets(job)
        # Overlapping: _targets already left the last healthy group out where it must be spared.
        target = pick_target(self.rng, targets, fault, self.allow_last_healthy or self.overlap)
        if target is None:
            self._hold(job, blocked_reason(None, True, False), healthy=sorted(targets))
            return
        kind = fault_kind(fault.kind)
        # A group hit while it starts or heals (overlap) has no commit yet: its failure is then
        # of every group, at no step (monarch_ft.records.recovered.Failure.after_commit).
        commit = job.last_commit.get(target)
        failure = Failure.after_commit(0.0, target, job.attempt(target), commit, range(job.cfg.ft.replica_groups))
        injected_at = time.time()
        # A kind that ends this process (the controller) is recorded (event, state) first.
        details = kind.announce(job, target, fault) if kind.ends_this_process else kind.inject(job, target, fault)
        active = {
            "id": self.next_index,
            "kind": fault.kind,
            "mode": kind.mode(fault),
            "target": target,
            "rank": fault.rank,
            "attempt": job.attempt(target),
            "at_step": fault.at_step,
            "at_s": fault.at_s,
            "step": failure.step,
            "members": sorted(failure.members),
            "injected_at": injected_at,
        }
        if kind.needs_next(fault):
            active["details"] = details  # what after_next needs (the node), kept with the drill's state
        if not self.actives:
            self._records = []
        self.actives.append(active)
        self.injected.append(active)
        job.emit(
            EventKind.FAULT_INJECTED,
            time=injected_at,
            fault_id=self.next_index,
            of=len(self.faults),
            kind=fault.kind,
            target=target,
            rank=fault.rank,
            attempt=job.attempt(target),
            step=failure.step,
            **{"mode": kind.mode(fault), **details},
        )
        # A fault timed from this one's injection (node_down's back_after_next_s) starts its clock.
        if self.next_index > 0 and len(self.injected) >= 2:
            previous = self.faults[self.next_index - 1]
            fault_kind(previous.kind).after_next(job, previous, self.injected[-2].get("details", {}))
        self.next_index += 1
        if kind.ends_this_process:
            self._save()
            kind.inject(job, target, fault)
