"""What a drill says happened to each fault (pure: chaos.outcome, chaos.config modes)."""

from __future__ import annotations

import pytest

from chaos.config import ChaosConfig, DrillConfig, FaultConfig, validate_chaos
from chaos.kinds import fault_label, fault_mode
from chaos.outcome import NotInjected, blocked_reason, explain_not_injected, fix_line, recovery_path
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import RecoveryPath


def test_the_injector_names_what_holds_a_fault_back_in_its_own_order():
    assert blocked_reason(active_id=0, due=True, target_ok=True) is NotInjected.PREVIOUS_NOT_RECOVERED
    assert blocked_reason(None, due=False, target_ok=True) is NotInjected.NOT_DUE
    assert blocked_reason(None, due=True, target_ok=False) is NotInjected.NO_HEALTHY_TARGET
    assert blocked_reason(None, due=True, target_ok=True) is None


def test_a_fault_that_never_fired_is_not_injected_with_its_reason_and_fix():
    # The repro: the survivor reached training.steps=120 while the first restart ran.
    fault = {"id": 1, "kind": "hang", "at_step": 25, "target": None}
    out = explain_not_injected(fault, {"reason": "previous_not_recovered", "previous": 0}, steps=120, job_step=120)
    assert out["reason"] == "previous_not_recovered" and "fault 0 was still recovering" in out["detail"]
    assert "raise training.steps" in out["fix"]
    late = explain_not_injected({"id": 2, "kind": "node", "at_step": 300}, {"reason": "not_due"}, steps=5000, job_step=140)
    assert late["reason"] == "not_due" and "at_step=300" in late["detail"] and "move at_step below 140" in late["fix"]
    gone = explain_not_injected({"id": 3, "kind": "node", "at_step": 30, "target": 1}, {"reason": "no_healthy_target", "healthy": [0]}, 200, 200)
    assert "target group 1 was not stepping" in gone["detail"] and "drop target" in gone["fix"]
    queued = explain_not_injected({"id": 4, "kind": "sigterm", "at_step": 40}, None, 200, 200)
    assert queued["reason"] == "queued" and "fault None" not in queued["detail"]
    faults = [
        {"id": 0, "kind": "process_kill", "injected": True},
        {"id": 1, "kind": "hang", "injected": False, "not_injected": out},
        {"id": 2, "kind": "node", "injected": False, "not_injected": late},
    ]
    line = fix_line(faults)
    assert line.startswith("fault 1 (hang) was not injected") and "raise training.steps" in line and "(2 faults never fired)" in line
    assert fix_line(faults[:1]) is None


def test_each_recovery_names_its_path():
    events = [
        {"event": "recovery_path", "group": 1, "path": "standby", "time": 5.0},  # before the fault: another one's
        {"event": "recovery_path", "group": 0, "path": "standby", "time": 11.0},
        {"event": "recovery_path", "group": 1, "path": "warm_fork", "time": 12.0},
    ]
    assert recovery_path(events, group=1, since=10.0, until=20.0, relaunched=True) == RecoveryPath.WARM_FORK
    # No recovery_path event (a build without standby groups): a relaunch is a cold start.
    assert recovery_path(events, group=1, since=13.0, until=20.0, relaunched=True) == RecoveryPath.COLD_START
    assert recovery_path([], group=1, since=0.0, until=20.0, relaunched=False) is None  # in place


def test_hang_and_collective_modes_are_validated():
    assert fault_mode(FaultConfig(kind="hang")) == "sigstop" and fault_mode(FaultConfig(kind="collective")) == "abort"
    assert fault_mode(FaultConfig(kind="hang", mode="gil")) == "gil" and fault_mode(FaultConfig(kind="node")) is None
    assert fault_label("hang", "gil") == "hang:gil" and fault_label("hang", "sigstop") == "hang" and fault_label("node", None) == "node"
    cfg = DrillConfig()
    cfg.chaos = ChaosConfig()
    with pytest.raises(ConfigError, match=r"mode='freeze': hang faults are sigstop or gil"):
        validate_chaos(cfg, [FaultConfig(kind="hang", mode="freeze", at_step=5)])
    with pytest.raises(ConfigError, match="node faults have no mode"):
        validate_chaos(cfg, [FaultConfig(kind="node", mode="gil", at_step=5)])
    validate_chaos(cfg, [FaultConfig(kind="hang", mode="gil", at_step=5)])
    cfg.launcher.name = "monarch"
    with pytest.raises(ConfigError, match="mode=gil: a Monarch actor trains in a worker thread"):
        validate_chaos(cfg, [FaultConfig(kind="hang", mode="gil", at_step=5)])


def test_the_bench_plans_modes_by_kinds_and_skips_what_this_build_lacks():
    import importlib.util

    bench = importlib.import_module("monarch_ft.recipes.mttr_bench")
    job = bench.MTTRBenchConfig()
    job.bench.kinds = ["process_kill", "hang:gil"]
    drills, skipped = bench.plan(job)
    has_standby = hasattr(job.ft, "standby_groups")
    modes = ["live_standby", "live", "full_restart"] if has_standby else ["live", "full_restart"]
    assert [(m, k) for m, k, _ in drills] == [(m, k) for m in modes for k in ("process_kill", "hang:gil")]
    assert bool(skipped) != has_standby and (has_standby or "ft.standby_groups" in skipped[0])
    gil = next(cfg for m, k, cfg in drills if k == "hang:gil")
    assert [(f.kind, f.mode, f.at_step) for f in gil.chaos.faults] == [("hang", "gil", 10), ("hang", "gil", 25)]
    assert next(cfg for m, _, cfg in drills if m == "full_restart").ft.recovery == "full_restart"
    # Without a standby, live is the cold path and live_fork forks from a warm fork server;
    # the aggregate keeps them apart (live, live+fork) and the baseline never forks.
    from chaos.report import _recovery_key

    job.bench.kinds, job.bench.modes = ["process_kill"], ["live_fork", "live", "full_restart"]
    by_mode = {m: cfg for m, _, cfg in bench.plan(job)[0]}
    assert [by_mode[m].ft.warm_fork for m in ("live_fork", "live", "full_restart")] == [True, False, False]
    assert by_mode["live_fork"].ft.standby_groups == by_mode["live"].ft.standby_groups == 0
    keys = [_recovery_key({"recovery": c.ft.recovery, "standby_groups": c.ft.standby_groups, "warm_fork": c.ft.warm_fork}) for c in by_mode.values()]
    assert keys == ["live+fork", "live", "full_restart"]
    assert _recovery_key({"recovery": "live", "standby_groups": 1, "warm_fork": True}) == "live+standby"
    job.bench.kinds = ["hang:sideways"]
    with pytest.raises(ConfigError, match="hang has modes sigstop, gil"):
        bench.plan(job)
    job.bench.kinds, job.bench.modes = ["node"], ["warp"]
    with pytest.raises(ConfigError, match="bench.modes: 'warp'"):
        bench.plan(job)


def test_the_drill_budget_check_counts_the_faults_of_one_restart_window():
    from chaos.config import restarts_in_one_window

    cfg = DrillConfig()
    cfg.chaos = ChaosConfig()
    cfg.ft.max_restarts, cfg.ft.restart_window_s = 2, 600.0
    # Three kills of group 0 a minute apart: they land in one window, over the budget of 2.
    close = [FaultConfig(kind="process_kill", target=0, at_s=60.0 * i) for i in range(3)]
    assert restarts_in_one_window(close, 600.0 + 120.0) == 3
    with pytest.raises(ConfigError, match=r"need up to 3 restarts of one group within ft.restart_window_s=600 but ft.max_restarts=2"):
        validate_chaos(cfg, close)
    # An hour apart (more than the window and a detection): one restart per window.
    apart = [FaultConfig(kind="process_kill", target=0, at_s=3600.0 * i) for i in range(3)]
    validate_chaos(cfg, apart)
    # A fault given by step has no known time: it counts in every window.
    with pytest.raises(ConfigError, match=r"need up to 3 restarts"):
        validate_chaos(cfg, apart[:2] + [FaultConfig(kind="process_kill", target=0, at_step=5), FaultConfig(kind="node", target=0, at_step=9)])
    # Other groups' faults and in-place faults use none of group 0's budget.
    validate_chaos(cfg, close[:2] + [FaultConfig(kind="process_kill", target=1, at_s=30.0), FaultConfig(kind="collective", target=0, at_s=40.0)])
    # A full restart restarts every group: every restarting fault counts for each.
    cfg.ft.recovery = "full_restart"
    with pytest.raises(ConfigError, match=r"need up to 3 restarts"):
        validate_chaos(cfg, close[:2] + [FaultConfig(kind="process_kill", target=1, at_s=30.0)])
