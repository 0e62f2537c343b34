"""Nodes across a cluster: which nodes the controller keeps new jobs off and when they return
(monarch_ft.controller.placement), how Slurm's node states read (launcher.slurm.node_health),
what a node fault needs of the launcher, and the scheduler's times in a drill's analysis."""

from __future__ import annotations

import pytest

from chaos.config import ChaosConfig, DrillConfig, FaultConfig, validate_chaos
from chaos.mttr import scheduler_times
from chaos.report import _scheduler_section, phase_stats
from monarch_ft.config.ft import FTConfig
from monarch_ft.controller.placement import NodePool, node_suspicion
from monarch_ft.launcher import launcher_traits
from monarch_ft.launcher.slurm import Options, node_health
from monarch_ft.launcher.slurm_nodes import SimulatedNode, read_record, write_record
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import ExclusionReason, NodeHealth, ReturnReason
from monarch_ft.records.exits import LOST_EXIT, describe_exit

UP, NR, DOWN = NodeHealth.UP, NodeHealth.NOT_RESPONDING, NodeHealth.DOWN


def test_a_node_is_suspect_when_all_its_ranks_vanished_or_slurm_counts_it_gone():
    assert node_suspicion([LOST_EXIT, LOST_EXIT], UP) is ExclusionReason.RANKS_LOST
    # One rank lost and its peer still running, or exits recorded (a process fault): not the node.
    assert node_suspicion([LOST_EXIT, None], UP) is None
    assert node_suspicion([-9, 1], UP) is None
    assert node_suspicion([-9, LOST_EXIT], None) is None
    assert node_suspicion([], UP) is None
    # Slurm's own word wins, whatever the exits say (a remote node: its ranks just went silent).
    assert node_suspicion([None, None], NR) is ExclusionReason.NOT_RESPONDING
    assert node_suspicion([1, 1], DOWN) is ExclusionReason.NOT_RESPONDING
    assert node_suspicion([None], NodeHealth.OUT) is None


def test_an_excluded_node_returns_once_slurm_saw_it_down_and_up_again():
    pool = NodePool(probation_s=600)
    assert pool.exclude("n1", ExclusionReason.RANKS_LOST, 100.0, group=1, attempt=0) is not None
    assert pool.exclude("n1", ExclusionReason.NOT_RESPONDING, 101.0, group=0, attempt=2) is None, "the first reason stands"
    # Slurm still counts it up (it has not noticed yet): it stays out.
    assert pool.observe({"n0": UP, "n1": UP}, 103.0) == []
    assert pool.to_exclude(["n0", "n1", "n2"]) == {"n1"}
    assert pool.observe({"n1": NR}, 105.0) == []
    assert pool.observe({"n1": DOWN}, 111.0) == []
    assert pool.observe({}, 120.0) == [], "a node Slurm no longer lists stays out"
    (back,) = pool.observe({"n1": UP}, 131.5)
    assert (back.node, back.reason, back.excluded_s) == ("n1", ReturnReason.BACK_UP, 31.5)
    assert pool.to_exclude(["n0", "n1"]) == set()
    summary = pool.summary()
    assert summary["excluded_now"] == []
    assert summary["exclusions"] == [
        {"node": "n1", "reason": "ranks_lost", "group": 1, "attempt": 0, "at": 100.0, "returned_at": 131.5, "return_reason": "back_up", "excluded_s": 31.5}
    ]


def test_a_node_slurm_never_counts_down_returns_after_probation():
    pool = NodePool(probation_s=60)
    pool.exclude("n2", ExclusionReason.RANKS_LOST, 0.0, group=0, attempt=1)
    assert pool.observe({"n2": UP}, 59.0) == []
    (back,) = pool.observe({"n2": UP}, 60.0)
    assert back.reason is ReturnReason.NEVER_DOWN
    # Excluded again later: a new entry in the record.
    pool.exclude("n2", ExclusionReason.NOT_RESPONDING, 70.0, group=1, attempt=2)
    assert [e["reason"] for e in pool.summary()["exclusions"]] == ["ranks_lost", "not_responding"]
    assert pool.summary()["excluded_now"] == ["n2"]


def test_new_jobs_are_never_kept_off_every_node():
    pool = NodePool(probation_s=60)
    for node in ("n0", "n1"):
        pool.exclude(node, ExclusionReason.RANKS_LOST, 0.0, group=0, attempt=0)
    assert pool.to_exclude(["n0", "n1", "n2"]) == {"n0", "n1"}
    # Excluding both nodes of a two-node cluster would refuse every job: the scheduler decides.
    assert pool.to_exclude(["n0", "n1"]) == set()


@pytest.mark.parametrize(
    "state,health",
    [
        ("idle", UP),
        ("allocated", UP),
        ("mixed", UP),
        ("completing", UP),
        ("idle*", NR),
        ("allocated*", NR),
        ("completing*", NR),
        ("down*", DOWN),
        ("down", DOWN),
        ("fail", DOWN),
        ("drained", NodeHealth.OUT),
        ("draining", NodeHealth.OUT),
        ("unknown*", NodeHealth.OUT),
    ],
)
def test_slurm_node_states_read_as_health(state, health):
    assert node_health(state) is health


def test_a_lost_rank_is_named_so():
    assert describe_exit(LOST_EXIT) == {"exit_code": LOST_EXIT, "exit_reason": "lost"}


def test_node_down_needs_a_cluster_of_simulated_nodes(tmp_path):
    """Refused up front, from the cluster's record beside its slurm.conf: nothing is launched."""
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("ClusterName=x\n")
    cfg = DrillConfig()
    cfg.chaos = ChaosConfig()
    cfg.launcher.name = "slurm"
    cfg.launcher.options = {"slurm_conf": str(conf)}
    with pytest.raises(ConfigError, match=r"chaos.faults\[0\].kind=node_down: needs nodes that can fail.*slurm_cluster --nodes"):
        validate_chaos(cfg, [FaultConfig(kind="node_down", at_step=5)])
    cfg.launcher.name = "local"
    cfg.launcher.options = {"simulated_hosts": True}
    with pytest.raises(ConfigError, match="needs nodes that can fail"):
        validate_chaos(cfg, [FaultConfig(kind="node_down", at_step=5)])
    node = SimulatedNode("h0", "h0", "10.213.7.2", "v0", ["slurmd", "-D"], str(tmp_path / "log"), str(conf))
    write_record(str(conf), [node])
    assert read_record(str(conf)) == {"h0": node}
    cfg.launcher.name = "slurm"
    cfg.launcher.options = {"slurm_conf": str(conf)}
    assert launcher_traits(cfg.launcher).node_faults
    validate_chaos(cfg, [FaultConfig(kind="node_down", at_step=5, duration_s=20), FaultConfig(kind="node", at_step=9)])
    # Back some seconds after the next fault: there must be one.
    validate_chaos(cfg, [FaultConfig(kind="node_down", at_step=5, back_after_next_s=5), FaultConfig(kind="node", at_step=9)])
    with pytest.raises(ConfigError, match=r"chaos.faults\[1\]: timed from the drill's next fault \(back_after_next_s\) but the last one: add a fault"):
        validate_chaos(cfg, [FaultConfig(kind="node", at_step=3), FaultConfig(kind="node_down", at_step=5, back_after_next_s=5)])
    with pytest.raises(ConfigError, match=r"back_after_next_s=0.0: must be > 0 \(seconds after the next fault\)"):
        validate_chaos(cfg, [FaultConfig(kind="node_down", at_step=5, back_after_next_s=0), FaultConfig(kind="node", at_step=9)])
    with pytest.raises(ConfigError, match=r"duration_s=0.0: must be > 0"):
        FaultConfig(kind="node_down", at_step=5, duration_s=0)
    assert read_record(str(tmp_path / "nowhere.conf")) == {} and read_record(None) == {}


def test_the_new_settings_are_checked():
    with pytest.raises(ConfigError, match=r"launcher.options.node_poll_interval_s=0: must be > 0"):
        Options(node_poll_interval_s=0).check("slurm")
    with pytest.raises(ConfigError, match=r"ft.node_probation_s=0: must be > 0"):
        FTConfig(node_probation_s=0).check()


def _events():
    return [
        {"time": 5.0, "event": "group_placed", "group": None, "standby": 0, "attempt": 0, "node": "n2", "allocation_s": 1.1},
        {"time": 100.0, "event": "fault_injected", "fault_id": 0, "kind": "node_down", "target": 1, "node": "n1"},
        {"time": 100.4, "event": "node_excluded", "node": "n1", "reason": "ranks_lost"},
        {"time": 100.5, "event": "standby_promoted", "standby": 0, "group": 1, "attempt": 1},
        {"time": 105.0, "event": "node_state", "node": "n1", "state": "allocated*", "health": "not_responding"},
        {"time": 111.0, "event": "node_state", "node": "n1", "state": "down*", "health": "down"},
        {"time": 132.0, "event": "node_returned", "node": "n1", "reason": "back_up"},
        {"time": 140.0, "event": "fault_injected", "fault_id": 1, "kind": "process_kill", "target": 0},
        {"time": 141.0, "event": "group_placed", "group": 0, "standby": None, "attempt": 1, "node": "n1", "allocation_s": 0.9},
    ]


def test_the_drill_puts_slurms_times_beside_ours():
    events = _events()
    first = scheduler_times({"id": 0, "injected_at": 100.0, "target": 1}, [e for e in events if e["time"] < 140.0], new_attempt=1)
    assert first == {
        "failed_node": "n1",
        "not_responding_s": 5.0,
        "down_s": 11.0,
        "excluded_s": 0.4,
        "returned_s": 32.0,
        "replacement_node": "n2",  # the promoted standby's, allocated before the fault
        "replacement_allocation_s": None,
    }
    second = scheduler_times({"id": 1, "injected_at": 140.0, "target": 0}, events, new_attempt=1)
    assert second == {"failed_node": None, "replacement_node": "n1", "replacement_allocation_s": 0.9}
    assert scheduler_times({"id": 0, "injected_at": 1.0, "target": 0}, [{"time": 2.0, "event": "group_failed", "group": 0}], 1) is None
    faults = [
        {"id": 0, "kind": "node_down", "injected": True, "phases": {"detected": 0.4}, "mttr_s": 1.5, "scheduler": first},
        {"id": 1, "kind": "process_kill", "injected": True, "phases": {"detected": 0.3}, "mttr_s": 9.0, "scheduler": second},
    ]
    assert phase_stats(faults)["node_down"]["scheduler"]["not_responding_s"]["p50"] == 5.0
    section = "\n".join(_scheduler_section(faults))
    assert "| 0 | node_down | n1 | 0.40 | 0.40 | 5.00 | 11.00 | 32.00 | n2 | n/a |" in section
    assert "| 1 | process_kill | n/a | 0.30 | n/a | n/a | n/a | n/a | n1 | 0.90 |" in section


def test_a_pending_allocation_is_given_the_exclusions_as_they_are_now_once_per_change():
    """The tick's decision (monarch_ft.controller.decide.job.replan_pending): a standby submitted
    while two failed nodes were out is given the one still out once the other came back."""
    from monarch_ft.controller import actions as A
    from monarch_ft.controller.decide import job
    from monarch_ft.controller.decide.base import Decision, Facts, Tick
    from monarch_ft.controller.observe import Observations
    from monarch_ft.controller.state import JobState

    state = JobState.new(2, "/run", {}, "gate")
    pool = state.nodes
    pool.states = {"n0": "mixed", "n1": "idle", "n2": "down*", "n3": "mixed"}
    pool.exclude("n2", ExclusionReason.RANKS_LOST, 10.0, 0, 0)

    def tick(pending):
        t = Tick(None, state, Observations(20.0, pending=pending), Facts(), Decision())
        job.replan_pending(t)
        return t.out.actions

    first = tick({"17": ("n1", "n2")})
    assert [a for a in first if isinstance(a, A.ReplanPending)] == [A.ReplanPending("17", ("n2",))]
    (event,) = [a for a in first if isinstance(a, A.Emit)]
    assert event.fields == {"job_id": "17", "excluded_before": ["n1", "n2"], "excluded": ["n2"]}
    assert tick({"17": ("n1", "n2")}) == []  # asked once (Slurm's answer shows at the next squeue)
    assert tick({"17": ("n2",)}) == [] and tick({}) == [] and pool.replans == {}
    # n2 back too: the next pending job is given none.
    pool.excluded.clear()
    assert [a for a in tick({"18": ("n2",)}) if isinstance(a, A.ReplanPending)] == [A.ReplanPending("18", ())]


def test_a_node_down_timed_from_the_next_fault_comes_back_then(tmp_path):
    """node_down's back_after_next_s: the node is held down when it fails, and its return is set
    once the drill's next fault fires, whatever that fault waited for (a standby's build)."""
    from chaos.injector import ChaosInjector
    from chaos.kinds.node_down import HELD_S
    from monarch_ft.testing.fakes import FakeChaosJob

    faults = [FaultConfig(kind="node_down", at_s=1.0, target=1, back_after_next_s=5, wait_standby=False), FaultConfig(kind="node", at_s=30.0, target=2)]
    job = FakeChaosJob(str(tmp_path), groups=3)
    injector = ChaosInjector(faults, seed=0, allow_last_healthy=True, recovery_timeout_s=600, overlap=True)
    injector.tick(job, 101.5)
    assert job.calls == [("kill_host", 1, HELD_S)]  # held down: no return set yet
    injector.tick(job, 120.0)
    assert job.calls == [("kill_host", 1, HELD_S)]  # the next fault is not due: still down
    injector.tick(job, 131.0)
    assert job.calls[1:] == [("kill_host", 2, None), ("restore_host_after", "n1", 5.0)]
