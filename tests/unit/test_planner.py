"""The one recovery decision (monarch_ft.controller.planner): each rule and their order, on
plain job states."""

from __future__ import annotations

import pytest

from monarch_ft.controller.fork_pool import ServerState
from monarch_ft.controller.planner import (
    ColdStart,
    DiskFact,
    DiskRollback,
    Failure,
    FailureKind,
    ForkFact,
    FullRestart,
    GiveUp,
    Promote,
    RecoveryPlanner,
    RecoveryPolicy,
    Relaunch,
    RestartBudget,
    StateLost,
    WarmFork,
)
from monarch_ft.controller.state import GroupState, JobState
from monarch_ft.records.decisions import StateDecision, StateSource
from monarch_ft.records.events import GiveUpReason, GroupStatus, RecoveryPath

LOOP = {"error_type": "ValueError", "frame": "trainer.py:10 in build"}


def planner(mode: str = "live", max_restarts: int = 3, warm_fork: bool = True) -> RecoveryPlanner:
    return RecoveryPlanner(RecoveryPolicy(mode, RestartBudget(max_restarts, 100.0, 0.5, 8.0), warm_fork=warm_fork))


def job(*statuses: GroupStatus, job_step: int = 50) -> JobState:
    state = JobState(groups=[GroupState(i, s) for i, s in enumerate(statuses)])
    state.ledger.job_step = job_step
    return state


def test_a_failure_with_a_live_peer_promotes_a_ready_standby_else_relaunches():
    state = job(GroupStatus.RUNNING, GroupStatus.RUNNING)
    failure = Failure(FailureKind.EXIT, 1)
    p = planner()
    assert not p.needs_disk(state, failure)
    assert p.decide(state, failure, 10.0, ready_standbys=[4, 2]) == Promote("standby 4 is ready", group=1, standby=4)
    relaunch = p.decide(state, failure, 10.0)
    assert isinstance(relaunch, Relaunch) and not isinstance(relaunch, DiskRollback) and relaunch.backoff_s == 0.5
    # The backoff follows the group's relaunches within the window.
    state.groups[1].restart_times = [9.0, 9.5]
    assert p.decide(state, failure, 10.0).backoff_s == 2.0


def test_with_no_live_peer_the_state_comes_from_disk_or_the_job_is_lost():
    state = job(GroupStatus.WAITING, GroupStatus.RUNNING)
    failure = Failure(FailureKind.HUNG, 1)
    p = planner()
    assert p.needs_disk(state, failure)
    with pytest.raises(ValueError):
        p.decide(state, failure, 10.0)  # the loop must find the checkpoint first
    rollback = p.decide(state, failure, 10.0, disk=DiskFact(40))
    assert isinstance(rollback, DiskRollback) and rollback.step == 40
    lost = p.decide(state, failure, 10.0, ready_standbys=[0], disk=DiskFact(None, ("step 40 (group 0: truncated)",)))
    assert isinstance(lost, StateLost) and "step 40 (group 0: truncated)" in lost.reason
    # Nothing committed yet: its initial weights are the job's state.
    assert not p.needs_disk(job(GroupStatus.WAITING, GroupStatus.RUNNING, job_step=0), failure)


def test_the_restart_budget_gives_up_unless_the_failure_is_not_the_groups():
    state = job(GroupStatus.RUNNING, GroupStatus.RUNNING)
    state.groups[1].restart_times = [1.0, 2.0, 3.0]
    p = planner(max_restarts=3)
    gave_up = p.decide(state, Failure(FailureKind.EXIT, 1), 10.0, ready_standbys=[0])
    assert isinstance(gave_up, GiveUp) and gave_up.why is GiveUpReason.RESTART_BUDGET
    # A checkpoint that failed to load: relaunched, not charged, no longer backoff.
    uncharged = p.decide(state, Failure(FailureKind.LOAD_FAILED, 1), 10.0)
    assert isinstance(uncharged, Relaunch) and not uncharged.charged and uncharged.backoff_s == 0.5
    # Across windows: the old relaunches no longer count.
    assert isinstance(p.decide(state, Failure(FailureKind.EXIT, 1), 200.0), Relaunch)


def test_a_crash_loop_is_given_up_before_any_other_rule():
    state = job(GroupStatus.RUNNING, GroupStatus.RUNNING)
    state.groups[1].startup_failure = LOOP
    for mode in ("live", "full_restart"):
        action = planner(mode).decide(state, Failure(FailureKind.EXIT, 1, startup=LOOP), 10.0, ready_standbys=[0])
        assert isinstance(action, GiveUp) and action.why is GiveUpReason.CRASH_LOOP
    other = {"error_type": "KeyError", "frame": "trainer.py:10 in build"}
    assert isinstance(planner().decide(state, Failure(FailureKind.EXIT, 1, startup=other), 10.0), Relaunch)


def test_full_restart_mode_and_a_stall_restart_every_group():
    state = job(GroupStatus.RUNNING, GroupStatus.RUNNING)
    full = planner("full_restart").decide(state, Failure(FailureKind.EXIT, 1), 10.0, ready_standbys=[0])
    assert full == FullRestart("ft.recovery=full_restart", failed_group=1, trigger="full_restart")
    stall = planner().decide(state, Failure(FailureKind.STALL), 10.0)
    assert isinstance(stall, FullRestart) and stall.trigger == "job_stall" and stall.failed_group is None
    assert not planner().needs_disk(state, Failure(FailureKind.STALL))
    state.groups[0].restart_times = [1.0, 2.0, 3.0]
    assert isinstance(planner().reschedule(state, 0, charged=True, now=10.0), GiveUp)
    assert isinstance(planner().reschedule(state, 1, charged=True, now=10.0), Relaunch)


def test_replicas_that_diverged_restart_every_group_from_no_newer_than_their_last_agreed_step():
    state = job(GroupStatus.RUNNING, GroupStatus.RUNNING)
    failure = Failure(FailureKind.DIVERGED, at_most=25)
    action = planner().decide(state, failure, 10.0, ready_standbys=[0])
    assert isinstance(action, FullRestart) and action.trigger == "replicas_diverged" and action.at_most == 25 and action.failed_group is None
    assert "step 25" in action.reason and not planner().needs_disk(state, failure)
    # A corrupt or suspect group is an ordinary group failure: it heals from a live peer.
    assert isinstance(planner().decide(state, Failure(FailureKind.CORRUPT, 1), 10.0, ready_standbys=[0]), Promote)
    assert isinstance(planner().decide(state, Failure(FailureKind.SUSPECT, 1), 10.0), Relaunch)


def test_how_a_relaunch_starts():
    state = job(GroupStatus.WAITING, GroupStatus.RUNNING)
    state.groups[0].attempt = 1
    p = planner()
    assert p.launch(state, 0, ForkFact(server=ServerState.READY)) == WarmFork("the fork server on its host is ready", group=0)
    cold = p.launch(state, 0, ForkFact(server=ServerState.STARTING))
    assert isinstance(cold, ColdStart) and cold.reason == "the fork server is still importing" and cold.path is RecoveryPath.COLD_START
    assert p.launch(state, 0, ForkFact("launcher=slurm starts ranks through its engine", ServerState.READY)).reason.startswith("launcher=slurm")
    assert planner(warm_fork=False).launch(state, 0, ForkFact(server=ServerState.READY)).reason == "ft.warm_fork=false"
    failed = p.fork_failed(WarmFork("ready", group=0), "the fork server refused: ENOMEM")
    assert failed == ColdStart("the fork server refused: ENOMEM", group=0, planned=RecoveryPath.WARM_FORK)
    state.groups[0].attempt = 0
    assert p.launch(state, 0, ForkFact(server=ServerState.READY)) is None  # a first launch is no recovery


def test_the_state_source_is_one_typed_decision():
    p = planner()
    state = job(GroupStatus.RUNNING, GroupStatus.WAITING)
    assert p.state_source(state, (0,), None) == StateDecision(StateSource.PEER)
    disk = p.state_source(state, (), DiskFact(40))
    assert disk == StateDecision(StateSource.DISK, 40, steps_lost=10)
    assert StateDecision.from_record(disk.at("/c/step-40").to_record()) == StateDecision(StateSource.DISK, 40, 10, "/c/step-40")
    assert StateDecision.from_record({}) is None  # a shared start gate carries none
