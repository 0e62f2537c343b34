"""The controller's state (monarch_ft.controller.state): the generic snapshot round trip of a
fully populated JobState, the group status transitions, the takeover file's version."""

from __future__ import annotations

import dataclasses
import json

import pytest

from monarch_ft.controller.checkpoints import Recovered
from monarch_ft.controller.fork_pool import ForkPoolState
from monarch_ft.controller.hangs import StepTimeLearner
from monarch_ft.controller.integrity import IntegrityState, Print, Round, RoundKey
from monarch_ft.controller.ledger import CommitLedger
from monarch_ft.controller.snapshot import LIVE, OWN, from_record, not_saved, to_record, unset_fields
from monarch_ft.controller.standby_pool import StandbyPoolState, UnreadyClock
from monarch_ft.controller.state import (
    Failure,
    FailureKind,
    LaunchPlan,
    PendingRestart,
    TRANSITIONS,
    GroupState,
    IllegalTransition,
    JobState,
    LaunchRecord,
    LighthouseOutage,
    LighthouseState,
    RankState,
    can_transition,
)
from monarch_ft.controller.placement import Exclusion, NodePool, Suspect
from monarch_ft.launcher.base import RankLaunch
from monarch_ft.records.events import ExclusionReason, GiveUpReason, GroupStatus, JobStatus


def populated() -> JobState:
    """A JobState with every saved field away from its default."""
    launch = LaunchRecord(1, 0, 2, ["python", "-m", "w", "spec"], "/r/logs/g1r0.a2.log", "/r", "h1", True, 10, 3)
    rank = RankState(
        launch,
        pid=4242,
        start="123456",
        report_offset=777,
        exited=-9,
        last_step=41,
        train_done=True,
        state_hash="abc",
        first_step_seen=True,
        model_ready=True,
        link_probe="10.213.7.3:40123",
        phase="compute",
        phase_since=12.5,
        error={"error": "ValueError: x", "error_type": "ValueError", "frame": "f:1 in g", "rank": 0, "attempt": 2},
    )
    group = GroupState(
        1,
        GroupStatus.GIVEN_UP,
        attempt=2,
        restarts=2,
        launched_at=98.0,
        ranks=[rank],
        plan=LaunchPlan(99.5, 40, "/r/checkpoint/group_0/step-40", "/r/control/start.1"),
        failure=Failure(FailureKind.EXIT, 1, {"error_type": "ValueError"}, (Suspect("n1", ExclusionReason.RANKS_LOST),), 30),
        last_step=42,
        train_done=True,
        first_loss=7.5,
        last_loss=2.25,
        gate="/r/control/launch.g1.a2",
        loading=(40, "/r/checkpoint/group_0/step-40"),
        load_failure={"step": 40, "error": "boom"},
        gate_decided=True,
        restart_times=[90.0, 95.5],
        startup_failure={"error_type": "ValueError", "frame": "f:1 in g"},
        last_error={"error": "ValueError: x"},
        gave_up=GiveUpReason.CRASH_LOOP,
    )
    return JobState(
        run_dir="/r",
        config={"ft": {"replica_groups": 2}},
        status=JobStatus.DEGRADED,
        started=10.0,
        tokens_path="/data/tokens.npy",
        groups=[group],
        full_restarts=1,
        gate_since=50.0,
        restart_pending=PendingRestart(1, "replicas_diverged", False, 36),
        ledger=CommitLedger(job_step=42, newest={7: 41, 8: 12}),
        rollbacks=[{"from_step": 30, "to_step": 20, "steps_lost": 10}],
        regressions=[{"group": 0, "step": 3, "job_committed": 9}],
        steps_redone=[{"step": 5, "group": 1, "quorum_id": 4}],
        commit_hashes={(41, 0): {7: (1, "abc")}},
        redone_seen={(5, 4)},
        step_hashes={41: {(1, 0): "abc"}},
        last_commit={1: {"step": 41, "time": 99.0}},
        membership=(0, 1),
        transport_owner={"http://h1:1": (1, 0), None: (0, 0)},
        first_step_time=11.0,
        step_times=StepTimeLearner(window=50, samples=[0.2, 0.3], seen={(1, 0, 2), (None, None, None)}),
        stall_since=60.0,
        stall_grace_until=65.0,
        excluded_hosts={"10.77.0.2": "group 1 was a cpu straggler there (3.1x its peers)"},
        lighthouse=LighthouseState("http://h:29510", 29510, 2, 11, "111", 12, "222", LighthouseOutage(70.0, 69.0, 40)),
        unloadable={30: "failed to load"},
        recovered=Recovered(20, {"/r/checkpoint/group_0": "/r/checkpoint/group_0/step-20"}, [{"step": 30}], [{"step": 20, "error": "ENOSPC"}]),
        integrity=IntegrityState(
            rounds={RoundKey(40, False, 7): Round(RoundKey(40, False, 7), 39, {0, 1}, {(0, 0): Print(0, 0, 2, "ab" * 8, "12345678")})},
            last_agreed={0: 36, 1: 36},
            agreed={36: {0: "cd" * 8}},
            names={0: ["model.a", "optim.a.exp_avg"]},
            condemned={(1, 1)},
            attempts={0: 2, 1: 2},
            streak={(0, 2): 1},
            start_step=20,
            ratios=[0.02, 0.03],
            decided=True,
        ),
        standby=StandbyPoolState(launched=3, promoted=1, lost=1, failed_builds=1, ready_s=[4.5], clock=UnreadyClock(1, 12.0, 2, 80.0)),
        forks=ForkPoolState(starts={"localhost": 2}, failed_starts={"localhost": 1}),
        nodes=NodePool(
            probation_s=60.0,
            excluded={"n1": Exclusion("n1", ExclusionReason.RANKS_LOST, 80.0, 1, 2, seen_down=True)},
            history=[{"node": "n1", "reason": "ranks_lost", "group": 1, "attempt": 2, "at": 80.0, "returned_at": None, "return_reason": None}],
            states={"n0": "idle", "n1": "down*"},
            placements=4,
            replans={"17": ("n1",)},
        ),
        launcher_handles={"jobs": [["17", 0, 1, 5.0, False]]},
        stop_seen=True,
        ended_by="lease_expired",
    )


def test_a_fully_populated_state_round_trips_through_json():
    state = populated()
    # Every saved field holds a value of its own: a field added to the state without one here fails.
    assert unset_fields(state) == []
    record = json.loads(json.dumps(to_record(state)))
    back = from_record(JobState, record)
    assert back == state
    # Restored by type, not merely equal: tuples, sets, enums, int keys, nested dataclasses.
    g = back.groups[0]
    assert isinstance(g.loading, tuple) and isinstance(back.membership, tuple) and isinstance(back.redone_seen, set)
    # A stopped group's failure waiting for its answer, and a full restart waiting for its step, go on with a takeover.
    assert isinstance(g.plan, LaunchPlan) and g.failure.kind is FailureKind.EXIT and isinstance(g.failure.suspects[0], Suspect)
    assert isinstance(back.restart_pending, PendingRestart) and back.restart_pending.at_most == 36
    assert g.status is GroupStatus.GIVEN_UP and g.gave_up is GiveUpReason.CRASH_LOOP and back.status is JobStatus.DEGRADED
    assert back.commit_hashes == {(41, 0): {7: (1, "abc")}} and back.step_hashes[41] == {(1, 0): "abc"}
    assert back.transport_owner[None] == (0, 0) and back.ledger.newest == {7: 41, 8: 12}
    assert isinstance(back.standby.clock, UnreadyClock) and isinstance(back.lighthouse.outage, LighthouseOutage)
    assert isinstance(back.recovered, Recovered) and back.groups[0].ranks[0].launch == state.groups[0].ranks[0].launch
    assert isinstance(back.nodes.excluded["n1"], Exclusion) and back.nodes.excluded["n1"].reason is ExclusionReason.RANKS_LOST
    # The integrity checks' rounds keyed by their RoundKey, their prints by (group, rank): a takeover goes on with them.
    rnd = back.integrity.rounds[RoundKey(40, False, 7)]
    assert rnd.key == RoundKey(40, False, 7) and rnd.members == {0, 1} and isinstance(rnd.prints[(0, 0)], Print)
    assert back.integrity.condemned == {(1, 1)} and back.integrity.streak == {(0, 2): 1} and back.integrity.agreed == {36: {0: "cd" * 8}}


def test_what_a_snapshot_leaves_out_is_declared_and_comes_back_as_its_default():
    # The live handles a takeover rebuilds, and this controller's own view.
    assert not_saved(RankState) == {"last_progress": OWN, "phase_seen": OWN, "os_sample": OWN, "cpu_sample": OWN, "proc": LIVE, "tail": LIVE}
    assert not_saved(JobState) == {"ckpt_health": OWN, "verified": OWN, "watch": OWN, "stragglers": OWN}
    state = populated()
    rank = state.groups[0].ranks[0]
    rank.last_progress, rank.proc, rank.tail = 5.0, object(), object()
    state.watch.fatal = "lost"
    record = to_record(state)
    assert "proc" not in record["groups"][0]["ranks"][0] and "watch" not in record
    back = from_record(JobState, json.loads(json.dumps(record)))
    assert back.groups[0].ranks[0].proc is None and back.groups[0].ranks[0].last_progress == 0.0 and back.watch.fatal is None


def test_a_rank_launch_record_is_its_launch_less_the_environment():
    kept = {f.name for f in dataclasses.fields(LaunchRecord)}
    assert kept | set(LaunchRecord.LEFT_OUT) == {f.name for f in dataclasses.fields(RankLaunch)} and not kept & set(LaunchRecord.LEFT_OUT)
    launch = RankLaunch(1, 0, 2, ["python"], {"SECRET": "x"}, "/log", "/r", host="h1", extra={"a": 1}, standby=3)
    record = LaunchRecord.of(launch)
    assert "SECRET" not in json.dumps(to_record(record))
    assert record.launch() == dataclasses.replace(launch, env={}, extra={})


def test_group_transitions_follow_the_table():
    statuses = list(GroupStatus)
    assert set(TRANSITIONS) == set(statuses)
    for src in statuses:
        for dst in statuses:
            g = GroupState(0, src)
            if can_transition(src, dst):
                g.move(dst)
                assert g.status is dst
            else:
                with pytest.raises(IllegalTransition):
                    g.move(dst)
                assert g.status is src
    # What the loop relies on: a launch, a first step, a failure (stopped first) and its relaunch or
    # a promotion in place of the failed group, a finish; a group done or given up never changes again.
    assert can_transition(GroupStatus.WAITING, GroupStatus.STARTING) and can_transition(GroupStatus.STARTING, GroupStatus.RUNNING)
    assert can_transition(GroupStatus.RUNNING, GroupStatus.STOPPED) and can_transition(GroupStatus.STARTING, GroupStatus.STOPPED)
    assert can_transition(GroupStatus.STOPPED, GroupStatus.WAITING) and can_transition(GroupStatus.STOPPED, GroupStatus.STARTING)
    # Never from stepping straight to a relaunch: a failed group's ranks are stopped first.
    assert not can_transition(GroupStatus.RUNNING, GroupStatus.WAITING) and not can_transition(GroupStatus.RUNNING, GroupStatus.STARTING)
    assert not TRANSITIONS[GroupStatus.DONE] and not TRANSITIONS[GroupStatus.GIVEN_UP]
    with pytest.raises(IllegalTransition):
        GroupState(0).status = GroupStatus.RUNNING  # never set directly


def test_a_takeover_refuses_a_state_file_of_another_version(tmp_path):
    from monarch_ft.config.controller import ControllerConfig
    from monarch_ft.controller.takeover import Takeover
    from monarch_ft.records.errors import ConfigError
    from monarch_ft.records.layout import RunLayout

    layout = RunLayout(str(tmp_path))
    (tmp_path / "controller.json").write_text(json.dumps({"version": 1, "finished": False, "groups": []}))
    takeover = Takeover(ControllerConfig(attach=True), layout)
    with pytest.raises(ConfigError, match="state version 1"):
        takeover.open()
    takeover.lock.acquire()  # the refusal let go of the lock
    takeover.lock.release()
