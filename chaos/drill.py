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
from monarch_ft.records.goodput import goodput, goodput_ratio, median_step_s, rollbacks_of
from monarch_ft.records.layout import RunLayout, read_jsonl


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
        overlap=cfg.chaos.overlap,
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
    layout = RunLayout(run_dir)
    events = [e for e in read_jsonl(layout.events) if e["time"] >= started]
    metrics = [m for m in read_jsonl(layout.metrics) if m["time"] >= started]
    analyzed = analyze_faults(injector.injected, events, metrics, cfg)
    summary = json.load(open(layout.summary))
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
    figures = drill_goodput(cfg, events, metrics, summary, first_fault)
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
        # monarch_ft.records.goodput's definitions (drill_goodput): the useful group-steps from the
        # job's launch, against the steady rate before the first fault; ETTR at that pace.
        **figures,
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


def analyze_faults(injected: list[dict], events: list[dict], metrics: list[dict], cfg: DrillConfig) -> list[dict]:
    """Each injected fault analysed (chaos.mttr.analyze_fault) over its own stretch of the run.

    One at a time (the drill's default): a fault's records end at the next fault's injection,
    and the throughput before it starts at the previous fault's recovery (a disruption is never
    the "before" of the next). With ``chaos.overlap`` a fault may be injected while another
    recovers: nothing cuts its records then (a second fault on a group still coming back delays
    that group's return, and the first fault is recovered only when the group is back, as the
    injector judged it live); the phases of overlapping faults may then share events.
    """
    out: list[dict] = []
    for i, f in enumerate(injected):
        later = injected[i + 1 :]
        until = later[0]["injected_at"] if later and not cfg.chaos.overlap else float("inf")
        since = float("-inf")
        if out:
            prev = out[-1]
            # The previous fault's end: its recovery; one never recovered leaves no clean "before".
            since = prev["injected_at"] + prev["mttr_s"] if prev.get("mttr_s") is not None else float("inf")
        out.append(analyze_fault(f, events, metrics, cfg.ft.recovery == "full_restart", cfg.ft.replica_groups, cfg.ft.ranks_per_group, until, since))
    return out


def drill_goodput(cfg: DrillConfig, events: list[dict], metrics: list[dict], summary: dict, first_fault: float | None) -> dict:
    """The drill's goodput figures (monarch_ft.records.goodput's definitions).

    ``goodput``: useful group-steps per second from the job's launch (its ``job_started`` event) to
    the last useful commit, warm-up and every loss charged. ``fault_free_group_steps_per_s``: the
    steady rate before the first fault (from the first commit: a drill has no fault-free run of
    its own, so its warm-up is not in the reference and a drill without faults would still read
    below 1 by its warm-up). ``ettr``: useful group-steps at the median step time before the first
    fault, over groups x wall seconds.

    Args:
        cfg: the drill's config.
        events, metrics: the run's records.
        summary: the job's summary.json (the standby groups it kept).
        first_fault: the first fault's injection (None: none fired).
    """
    groups = cfg.ft.replica_groups
    standbys = int((summary.get("standby") or {}).get("standby_groups") or 0)
    launched = [e["time"] for e in events if e.get("event") == EventKind.JOB_STARTED]
    commits = [m["time"] for m in metrics if m.get("rank") == 0 and m.get("committed")]
    launch = min(launched, default=min(commits, default=None))
    if launch is None:
        return {"launched_at": None, "goodput_group_steps_per_s": None, "fault_free_group_steps_per_s": None, "goodput_ratio": None, "ettr": None}
    rollbacks = rollbacks_of(events)
    tokens = cfg.training.batch_size * cfg.training.seq_len * cfg.ft.ranks_per_group
    whole = goodput(metrics, launch, groups, groups + standbys, rollbacks=rollbacks, tokens_per_group_step=tokens)
    first_commit = min(commits, default=None)
    steady = goodput(metrics, first_commit, groups, end=first_fault, rollbacks=rollbacks) if first_commit is not None else None
    pace = median_step_s(metrics, end=first_fault)
    rate, reference = (whole.rate if whole else None), (steady.rate if steady else None)
    return {
        "launched_at": launch,
        "warmup_s": round(first_commit - launch, 3) if first_commit is not None else None,
        "provisioned_replicas": groups + standbys,
        "useful_group_steps": whole.useful if whole else 0,
        "trained_group_steps": whole.trained if whole else 0,
        "rolled_back_group_steps": whole.rolled_back if whole else 0,
        "goodput_group_steps_per_s": rate,
        "goodput_tokens_per_s": whole.tokens_per_s if whole else None,
        "goodput_per_provisioned_replica": whole.rate_per_provisioned if whole else None,
        "fault_free_group_steps_per_s": reference,
        "goodput_ratio": goodput_ratio(rate, reference),
        "fault_free_median_step_s": pace,
        "ettr": whole.ettr(pace) if whole else None,
    }


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
