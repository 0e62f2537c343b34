"""Run one drill: the job with its faults, then the analysis and the report.

With ``chaos.baseline=true`` the same faults (same seed) run again in
``<run>/baseline`` under ``ft.recovery=full_restart`` and the report compares both.
"""

from __future__ import annotations

import copy
import json
import os
import time

from chaos.config import DrillConfig, validate_chaos
from chaos.injector import ChaosInjector
from chaos.kinds import fault_mode
from chaos.mttr import analyze_fault, steps_never_go_back
from chaos.outcome import NotInjected, explain_not_injected, explain_not_recovered
from chaos.requests import FaultRequests
from chaos.schedule import build_faults
from monarch_ft.controller.preflight import preflight
from monarch_ft.records.events import EventKind
from monarch_ft.records.integrity import INTEGRITY_ROLLBACK
from monarch_ft.records.goodput import goodput, goodput_ratio
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.reports import ReportTail


def _read_jsonl(path: str) -> list[dict]:
    return ReportTail(path).read()


def run_drill(cfg: DrillConfig, run_dir: str) -> dict:
    """Run the job with the faults injected; returns the drill dict (also drill.json)."""
    faults = build_faults(cfg.chaos)
    preflight(cfg)
    validate_chaos(cfg, faults)
    from monarch_ft.controller.loop import Supervisor  # after the checks: a bad drill is told at once

    injector = ChaosInjector(
        faults,
        cfg.chaos.seed,
        cfg.chaos.allow_last_healthy,
        cfg.chaos.recovery_timeout_s,
        cfg.chaos.tail_steps,
        state_path=RunLayout(run_dir).chaos_state,
        finish_when_done=not cfg.chaos.on_demand,
    )
    # chaos.on_demand: faults asked for while the drill runs join the queue (before the injector: due the same tick).
    requested = FaultRequests(injector, cfg, run_dir) if cfg.chaos.on_demand else None
    supervisor = Supervisor(cfg, run_dir, hooks=[requested, injector] if requested else [injector])
    if cfg.controller.attach:
        injector.restore()  # a controller fault: this controller took the drill over
        if requested is not None:
            requested.restore()
    started = injector.started
    code = supervisor.run()
    events = _read_jsonl(os.path.join(run_dir, "events.jsonl"))
    metrics = [m for m in _read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if m["time"] >= started]
    events = [e for e in events if e["time"] >= started]
    nexts = [f["injected_at"] for f in injector.injected[1:]] + [float("inf")]
    analyzed = [
        analyze_fault(f, events, metrics, cfg.ft.recovery == "full_restart", cfg.ft.replica_groups, cfg.ft.ranks_per_group, until)
        for f, until in zip(injector.injected, nexts)
    ]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    timed_out = {e.get("fault_id") for e in events if e["event"] == "fault_recovery_timeout"}
    for f in analyzed:
        if not f["recovered"]:
            f["not_recovered"] = explain_not_recovered(f["id"] in timed_out, cfg.chaos.recovery_timeout_s, cfg.training.steps, summary.get("job_step", 0))
    first_pending = len(injector.injected)
    for i, f in enumerate(faults[first_pending:], start=first_pending):
        entry = {"id": i, "kind": f.kind, "mode": fault_mode(f), "target": f.target, "rank": f.rank, "at_step": f.at_step, "at_s": f.at_s}
        blocked = injector.blocked.get(i) if i == first_pending else {"reason": NotInjected.QUEUED.value, "first_pending": first_pending}
        analyzed.append(
            {
                **entry,
                "injected": False,
                "injected_at": None,
                "phases": {},
                "mttr_s": None,
                "recovered": None,
                "weights_consistent": None,
                "not_injected": explain_not_injected(entry, blocked, cfg.training.steps, summary.get("job_step", 0)),
            }
        )
    integrity_rollbacks = [e for e in events if e["event"] == EventKind.JOB_ROLLBACK and e.get("reason") == INTEGRITY_ROLLBACK]
    first_fault = min((f["injected_at"] for f in injector.injected), default=None)
    # One definition of goodput, the goodput bench's too (monarch_ft.records.goodput): "fault free"
    # is the same rate from the first commit to the first fault.
    groups = cfg.ft.replica_groups
    before, whole = goodput(metrics, groups, end=first_fault), goodput(metrics, groups)
    rate, good = (before.rate if before else None), (whole.rate if whole else None)
    drill = {
        "recovery": cfg.ft.recovery,
        # Warm standby groups (ft.standby_groups, where this build has them): a sweep axis.
        "standby_groups": getattr(cfg.ft, "standby_groups", None),
        # Warm fork (ft.warm_fork): a relaunch with no standby ready forks from a fork server.
        "warm_fork": getattr(cfg.ft, "warm_fork", None),
        # The hang timeout setting (auto: learned from the step times).
        "hang_timeout_s": cfg.ft.hang_timeout_s,
        # ft.mode: a sweep axis; in localsgd/diloco a fault can cost up to a window of steps.
        "mode": cfg.ft.mode,
        "sync_every": cfg.ft.sync_every if cfg.ft.mode != "hsdp" else 1,
        "tokens_per_group_step": cfg.training.batch_size * cfg.training.seq_len * cfg.ft.ranks_per_group,
        "launcher": summary.get("launcher", cfg.launcher.name),
        "hosts": summary.get("hosts"),
        "seed": cfg.chaos.seed,
        "steps": cfg.training.steps,
        "replica_groups": cfg.ft.replica_groups,
        "ranks_per_group": cfg.ft.ranks_per_group,
        "started_at": started,
        "finished_at": time.time(),
        "exit_code": code,
        # Goodput counts batches that went into committed updates (a step with 1 of 2
        # groups counts once), per second; "fault free" is the same rate before the first fault.
        "fault_free_batches_per_s": rate,
        "goodput_batches_per_s": good,
        "goodput_ratio": goodput_ratio(good, rate),
        "ettr": whole.ettr if whole else None,
        "weights_consistent": summary["weights_consistent"],
        "steps_never_go_back": steps_never_go_back(metrics, integrity_rollbacks),
        # Committed steps given up on purpose: two replicas disagreed with no majority, and the
        # job went back to the newest checkpoint known good (recorded; not a loss of live recovery).
        "steps_lost_to_integrity": sum(e["steps_lost"] for e in integrity_rollbacks),
        # What the supervisor saw: committed steps given up (rollbacks) and commits below the
        # job's step (a group that trained on a stale state).
        "steps_lost": summary.get("steps_lost", 0),
        "step_regressions": summary.get("step_regressions", []),
        "steps_redone": summary.get("steps_redone", []),
        "faults": analyzed,
    }
    with open(os.path.join(run_dir, "drill.json"), "w") as f:
        json.dump(drill, f, indent=2)
    return drill


def drill_ok(drill: dict) -> bool:
    """Every fault recovered with consistent weights, and (live recovery) no committed step lost
    but those an integrity rollback gave up on purpose (two replicas that disagreed)."""
    live = drill["recovery"] != "full_restart"
    return (
        drill["exit_code"] == 0
        and drill["weights_consistent"]
        and not drill["step_regressions"]
        and (not live or (drill["steps_never_go_back"] and drill["steps_lost"] == drill.get("steps_lost_to_integrity", 0)))
        and all(f.get("injected", True) and f["recovered"] and f["weights_consistent"] is not False for f in drill["faults"])
    )


def baseline_config(cfg: DrillConfig) -> DrillConfig:
    """The drill's config for its ``chaos.baseline`` run: the same faults under ``ft.recovery=full_restart``,
    without the live run's standby setting (a full restart uses none, and refuses one)."""
    base_cfg = copy.deepcopy(cfg)
    base_cfg.ft.recovery = "full_restart"
    base_cfg.ft.standby_groups = None
    return base_cfg


def run_with_baseline(cfg: DrillConfig, run_dir: str) -> tuple[dict, dict | None]:
    drill = run_drill(cfg, run_dir)
    baseline = None
    if cfg.chaos.baseline:
        baseline = run_drill(baseline_config(cfg), os.path.join(run_dir, "baseline"))
    return drill, baseline
