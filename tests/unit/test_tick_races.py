"""Every race of read order this project's history found, replayed as a sequence of observations
given to the tick's pure decision (monarch_ft.controller.decide), with the actions asserted.

Each was found by a failed CI run of a real job, once per submission. In the tick's shape
(observe, decide, act) they have nowhere to live; these replays keep it so. Each fails if its race
is brought back (checked by reintroducing each one; see docs/design/controller.md, "Races"):

- the group that finished after the read (its last steps and rank_finished written after the
  tick's read of its reports, its exit seen in the same tick: marked done with its records unread);
- the finish read on both sides of a commit (a stop's finish at the controller's lagging view of
  the job's step: a rank had begun the very step it names);
- two integrity verdict rounds of the same attempts in one tick (two rollbacks for one divergence);
- two exits read in one look (two groups die together; the first one's standby was told to heal
  from the second, dead but not yet read); for forked ranks the look itself must see both, their
  exits coming through the fork server's channel (tests/jobs/test_fork_server_jobs.py);
- a whole-job freeze (the machine, the controller with it, stopped for longer than the hang
  timeout: every rank looked silent at once on waking, and every group was killed);
- records read twice across a takeover (relayed by a controller killed before its save: taken
  in by the next, relayed once);
- a quorum change read group after group (each group's commits of the steps before and after
  it in one read: the membership flapped twice per group).
"""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from monarch_ft.controller import actions as A
from monarch_ft.controller.decide import Facts, Rules, decide, decide_pending
from monarch_ft.controller.integrity import IntegrityJudge
from monarch_ft.controller.observe import ControlFiles, Observations, ProcessSample
from monarch_ft.controller.planner import DiskFact, RecoveryPlanner, RecoveryPolicy
from monarch_ft.controller.standby_pool import Standby
from monarch_ft.controller.takeover import progress_only
from monarch_ft.controller.state import JobState, LaunchRecord, RankState
from monarch_ft.records.decisions import StateSource
from monarch_ft.records.events import EventKind, GroupStatus, StandbyStatus
from monarch_ft.records.exits import RankExit
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.lease import FINISH_MARGIN
from monarch_ft.records.report_records import RankEvent, StepRecord
from monarch_ft.testing.fakes import fake_job_config

T0 = 1_800_000_000.0


class Replay:
    """A job's state with every group stepping at attempt 0, its rules, and a tick to replay.

    The executor's part (ranks stopped, started, promoted) is played by :meth:`acted`, so a
    sequence of ticks can go on from one tick's actions.
    """

    def __init__(self, tmp_path, groups: int = 2, ranks: int = 1, job_step: int = 20, **overrides: Any) -> None:
        overrides.setdefault("ft__standby_groups", 0)
        self.cfg = fake_job_config(str(tmp_path / "tokens.npy"), "127.0.0.1:1", ft__replica_groups=groups, ft__ranks_per_group=ranks, **overrides)
        self.layout = RunLayout(str(tmp_path / "run"))
        self.state = JobState.new(groups, self.layout.run_dir, {}, self.layout.start_gate(0))
        self.state.started = self.state.gate_since = T0
        self.state.first_step_time = T0 + 1
        for g in self.state.groups:
            g.move(GroupStatus.STARTING)
            g.move(GroupStatus.RUNNING)
            g.attempt = 0
            g.gate = self.layout.start_gate(0)
            g.last_step = job_step
            g.ranks = [self.rank(g.index, r, 0) for r in range(ranks)]
        self.state.ledger.record(job_step - 1, 1)
        self.state.watch.floor_written = self.state.job_step
        self.state.watch.gate_opened = self.layout.start_gate(0)
        self.state.membership = tuple(range(groups))
        self.state.standby.wanted = self.cfg.ft.standby_groups or 0
        self.judge = IntegrityJudge(ranks, auto=False, state=self.state.integrity)
        self.rules = Rules(
            cfg=self.cfg,
            planner=RecoveryPlanner(RecoveryPolicy.from_config(self.cfg)),
            layout=self.layout,
            judge=self.judge,
            launcher_name="fake",
            fork_problem=None,
            forks_enabled=False,
            compute_on_cpu=True,
            hang_timeout_fixed=3.0,
            node_health=lambda s: None,
        )
        self.now = T0 + 10

    def rank(self, group: int, rank: int, attempt: int) -> RankState:
        launch = LaunchRecord(group, rank, attempt, ["python"], self.layout.log(group, rank, attempt), self.layout.run_dir)
        rs = RankState(launch, last_progress=self.now if hasattr(self, "now") else T0 + 10, proc=SimpleNamespace(pid=None))
        rs.first_step_seen = rs.model_ready = True
        return rs

    def ready_standby(self, number: int = 0) -> Standby:
        sb = Standby(
            number, len(self.state.groups) + number, [self.rank(-1, r, 0) for r in range(self.cfg.ft.ranks_per_group)], T0, StandbyStatus.READY, T0 + 5
        )
        self.state.standby.standbys.append(sb)
        return sb

    def observe(self, dt: float = 0.05, **fields: Any) -> Observations:
        self.now += dt
        fields.setdefault("control", ControlFiles(hold=True, start_gate_open=True))
        return Observations(self.now, **fields)

    def tick(self, obs: Observations, facts: Optional[Facts] = None) -> list:
        """One tick's first pass, its actions acted out."""
        out = decide(self.rules, self.state, obs, facts)
        self.acted(out.actions)
        return out.actions

    def pending(self, obs: Observations, facts: Facts) -> list:
        out = decide_pending(self.rules, self.state, obs, facts)
        self.acted(out.actions)
        return out.actions

    def acted(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, (A.FailGroup, A.StopGroup)):
                for rs in a.ranks:
                    rs.exited = rs.exited if rs.exited is not None else -signal.SIGKILL
            elif isinstance(a, A.PromoteStandby):
                self.state.groups[a.group].ranks = [self.rank(a.group, rs.rank, a.attempt) for rs in a.entry.ranks]


def step(group: int, rank: int, n: int, committed: bool = True, **fields: Any) -> tuple[int, StepRecord]:
    raw = {"type": "step", "group": group, "rank": rank, "attempt": fields.pop("attempt", 0), "step": n, "committed": committed, "time": T0 + n, **fields}
    raw.setdefault("quorum_id", 1)
    raw.setdefault("participating_groups", [0, 1])
    return rank, StepRecord(raw)


def event(group: int, rank: int, kind: EventKind, **fields: Any) -> tuple[int, RankEvent]:
    return rank, RankEvent(kind, {"group": group, "rank": rank, "attempt": 0, "time": T0, **fields})


def emitted(actions: list, kind: Optional[str] = None) -> list:
    return [a for a in actions if isinstance(a, A.Emit) and (kind is None or a.kind == kind)]


def index_of(actions: list, pred) -> int:
    return next(i for i, a in enumerate(actions) if pred(a))


# ---------------------------------------------------------------- 1. the group that finished after the read
def test_a_group_that_writes_its_last_steps_and_exits_between_two_reads_is_done_with_them(tmp_path):
    job = Replay(tmp_path, job_step=40, training__steps=42)
    # Tick 1: group 1 is at step 40; group 0 is done and held.
    job.tick(job.observe(reports={0: [step(0, 0, 40), event(0, 0, EventKind.TRAIN_DONE)], 1: [step(1, 0, 40)]}))
    # Tick 2: group 1 wrote step 41, train_done and rank_finished (with its state hash), then
    # exited 0, all since tick 1's read: its exit and its last records are seen in the same tick.
    last = [step(1, 0, 41, state_hash="h41"), event(1, 0, EventKind.TRAIN_DONE), event(1, 0, EventKind.RANK_FINISHED, state_hash="h41", steps_trained=42)]
    actions = job.tick(job.observe(exits={(1, 0): 0}, reports={1: last}))
    finished = index_of(actions, lambda a: isinstance(a, A.Emit) and a.kind == EventKind.GROUP_FINISHED)
    relayed = index_of(actions, lambda a: isinstance(a, A.Emit) and a.kind == EventKind.RANK_FINISHED)
    metrics = index_of(actions, lambda a: isinstance(a, A.WriteMetrics) and any(r["step"] == 41 for r in a.records))
    exited = index_of(actions, lambda a: isinstance(a, A.Emit) and a.kind == EventKind.RANK_EXITED)
    # Its last step and its rank_finished are taken before its exit, and both before it is done.
    assert metrics < relayed < exited < finished, actions
    g1 = job.state.groups[1]
    assert g1.status is GroupStatus.DONE and g1.ranks[0].state_hash == "h41" and g1.last_step == 42
    assert job.state.job_step == 42 and emitted(actions, EventKind.GROUP_FINISHED)[0].fields["step"] == 42


# ---------------------------------------------------------------- 2. the finish read on both sides of a commit
def test_a_stop_asks_for_a_finish_ahead_of_any_step_a_rank_may_have_begun(tmp_path):
    job = Replay(tmp_path, job_step=100, training__steps=10_000)
    # The ranks step every 20 ms; the controller reads their reports a tick late.
    for n in range(100, 140):
        job.tick(job.observe(dt=0.02, reports={g: [step(g, 0, n, step_time_s=0.02, compute_s=0.015)] for g in (0, 1)}))
    view = job.state.job_step  # 140: the controller's view when the stop is seen
    actions = job.tick(job.observe(control=ControlFiles(stop_request=True, hold=True, start_gate_open=True)))
    (finish,) = [a for a in actions if isinstance(a, A.RequestFinish)]
    # The ranks may be a relay's lag ahead of the view (a second of steps here): the finish is
    # past that, so no rank has begun the step it names when it reads it.
    steps_per_s = 1 / 0.015
    assert finish.step >= view + FINISH_MARGIN + int(steps_per_s) and finish.reason == "stop_command", finish
    # Asked once.
    assert not [a for a in job.tick(job.observe(control=ControlFiles(stop_request=True, hold=True))) if isinstance(a, A.RequestFinish)]


# ---------------------------------------------------------------- 3. two verdict rounds in one tick
def test_two_rounds_of_one_divergence_in_one_tick_roll_the_job_back_once(tmp_path):
    job = Replay(tmp_path, job_step=30, checkpoint__enable=True)

    def fp(group: int, n: int, digest: str):
        return step(group, 0, n, fingerprint={"step": n, "digest": digest, "tensors": ""}, quorum_id=3)

    # Step 28 agreed; steps 30 and 31 fingerprinted, both groups disagreeing at each (two groups:
    # no majority), all four records read in one tick.
    job.tick(job.observe(reports={g: [fp(g, 28, "same")] for g in (0, 1)}))
    actions = job.tick(job.observe(reports={0: [fp(0, 30, "aa"), fp(0, 31, "ab")], 1: [fp(1, 30, "ba"), fp(1, 31, "bb")]}))
    rollbacks = [e for e in emitted(actions, EventKind.SDC_DETECTED) if e.fields["action"] == "rollback"]
    assert len(rollbacks) == 1, actions
    assert [type(a).__name__ for a in actions if isinstance(a, (A.StopGroup, A.FindDisk))] == ["StopGroup", "StopGroup", "FindDisk"]
    assert job.state.restart_pending is not None and job.state.restart_pending.at_most == 28
    # The disk found, the tick's next pass schedules every group once, from that step.
    actions = job.pending(job.observe(dt=0), Facts({28: DiskFact(25)}))
    (restart,) = emitted(actions, EventKind.FULL_RESTART)
    assert restart.fields["resume_step"] == 25 and len(emitted(actions, EventKind.RESTART_SCHEDULED)) == 2


# ---------------------------------------------------------------- 4. two exits read in one look
def test_two_groups_dead_in_one_look_promote_a_standby_from_disk_not_from_the_other(tmp_path):
    job = Replay(tmp_path, groups=2, ranks=2, job_step=15, checkpoint__enable=True, ft__standby_groups=1)
    job.ready_standby(0)
    # Every rank of both groups refused a commit below the floor and exited RankExit.COMMIT_BELOW_FLOOR...
    code = int(RankExit.COMMIT_BELOW_FLOOR)
    exits = {(g, r): code for g in (0, 1) for r in (0, 1)}
    # ...except group 1's rank 1, SIGKILLed: it, not its peer, is blamed for group 1.
    exits[(1, 1)] = -signal.SIGKILL
    actions = job.tick(job.observe(exits=exits))
    failed = [a for a in actions if isinstance(a, A.FailGroup)]
    assert [(f.group, f.why["rank"], f.why["exit_code"]) for f in failed] == [(0, 0, code), (1, 1, -signal.SIGKILL)]
    # Neither holds the job's state: the answer waits for the disk; no promotion yet.
    assert [a.at_most for a in actions if isinstance(a, A.FindDisk)] == [15] and not [a for a in actions if isinstance(a, A.PromoteStandby)]
    actions = job.pending(job.observe(dt=0), Facts({15: DiskFact(10)}))
    (promoted,) = [a for a in actions if isinstance(a, A.PromoteStandby)]
    assert promoted.decision.source is StateSource.DISK and promoted.decision.step == 10, promoted
    sources = [e.fields["source"] for e in emitted(actions, EventKind.STATE_SOURCE)]
    assert sources == [StateSource.DISK.value]
    # The other group goes back to disk too: a relaunch that loads the checkpoint, never a heal from a dead peer.
    (relaunch,) = [e for e in emitted(actions, EventKind.RESTART_SCHEDULED) if e.fields["group"] == 1]
    assert relaunch.fields["action"] == "disk_rollback"


# ---------------------------------------------------------------- 6. records read twice across a takeover
def test_records_a_killed_controller_relayed_are_taken_in_and_relayed_once(tmp_path):
    job = Replay(tmp_path, groups=2, job_step=20)
    job.state.groups[1].ranks[0].model_ready = False
    # The ticks since the dead controller's last save only took records in (progress_only: saved
    # up to PROGRESS_SAVE_MAX_S later); the next controller reads them again, marked relayed.
    again = {
        0: [(0, StepRecord(step(0, 0, 20)[1].raw, relayed=True))],
        1: [(0, RankEvent(EventKind.MODEL_READY, {"group": 1, "rank": 0, "attempt": 0, "time": T0, "transport_metadata": "m"}, relayed=True))],
    }
    actions = job.tick(job.observe(reports=again))
    # Taken in: the job's step and the rank's readiness, as the dead controller had them...
    assert job.state.job_step == 21 and job.state.groups[1].ranks[0].model_ready
    # ...relayed no second time: no metrics line, no event.
    assert not [a for a in actions if isinstance(a, A.WriteMetrics)] and not emitted(actions), actions
    # A record read for the first time is relayed, as the rank's own (a relay: progress only).
    actions = job.tick(job.observe(reports={0: [step(0, 0, 21)], 1: [event(1, 0, EventKind.CHECKPOINT_SAVED, step=20)]}))
    assert [a.records[0]["step"] for a in actions if isinstance(a, A.WriteMetrics)] == [21]
    assert [(e.kind, e.relay) for e in emitted(actions)] == [(EventKind.CHECKPOINT_SAVED, True)] and progress_only(actions)
    # The controller's own event is a decision: saved at the end of its tick.
    actions = job.tick(job.observe(exits={(1, 0): 1}))
    assert any(isinstance(a, A.Emit) and not a.relay for a in actions) and not progress_only(actions)


# ---------------------------------------------------------------- 5. a whole-job freeze
def test_a_freeze_of_the_whole_machine_kills_no_group_on_waking(tmp_path):
    job = Replay(tmp_path, job_step=50)
    job.tick(job.observe(reports={g: [step(g, 0, 50)] for g in (0, 1)}, samples={(g, 0): ProcessSample("sleeping", 1.0) for g in (0, 1)}))
    # The machine (the controller with it) stopped for 20 s, far past the 3 s hang timeout; on
    # waking, every rank has been silent for 20 s by the wall clock.
    woke = job.tick(job.observe(dt=20.0, samples={(g, 0): ProcessSample("sleeping", 1.0) for g in (0, 1)}))
    assert emitted(woke, EventKind.SUPERVISOR_STALLED) and not [a for a in woke if isinstance(a, (A.FailGroup, A.ReportStall))], woke
    # The ranks step again: nothing happened to them.
    later = job.tick(job.observe(dt=1.0, reports={g: [step(g, 0, 51)] for g in (0, 1)}, samples={(g, 0): ProcessSample("running", 1.1) for g in (0, 1)}))
    assert not [a for a in later if isinstance(a, (A.FailGroup, A.ReportStall))]
    assert all(g.status is GroupStatus.RUNNING for g in job.state.groups)


def test_every_group_silent_while_the_controller_runs_is_one_stall_not_a_failure_each(tmp_path):
    job = Replay(tmp_path, job_step=50)
    job.tick(job.observe(reports={g: [step(g, 0, 50)] for g in (0, 1)}))
    # Every rank silent past the hang timeout, the controller awake (ticks every 50 ms).
    actions: list = []
    for _ in range(80):
        actions += job.tick(job.observe(samples={(g, 0): ProcessSample("sleeping", 1.0) for g in (0, 1)}))
    stalls = [a for a in actions if isinstance(a, A.ReportStall)]
    assert len(stalls) == 1 and stalls[0].groups == (0, 1) and not [a for a in actions if isinstance(a, A.FailGroup)]


@pytest.mark.parametrize("freeze_s", [20.0])
def test_the_decision_reads_nothing_but_its_inputs(tmp_path, monkeypatch, freeze_s):
    """decide is pure: with every file and process call refused, a tick with a failure, a
    promotion and a stall still decides (the executor alone does I/O)."""
    import builtins
    import os

    job = Replay(tmp_path, job_step=15, checkpoint__enable=True, ft__standby_groups=1)
    job.ready_standby(0)

    def refuse(*a, **k):
        raise AssertionError("decide did I/O")

    monkeypatch.setattr(builtins, "open", refuse)
    for name in ("stat", "listdir", "scandir", "kill", "replace", "rename", "remove"):
        monkeypatch.setattr(os, name, refuse)
    actions = job.tick(job.observe(exits={(0, 0): -signal.SIGKILL}))
    assert [type(a).__name__ for a in actions if not isinstance(a, A.Emit)][:2] == ["FailGroup", "PromoteStandby"]
    monkeypatch.undo()


def test_a_full_restarts_gate_waits_for_a_group_still_in_its_backoff(tmp_path):
    """The shared gate of a full restart opens once every group scheduled to it is up and ready,
    the ones still waiting out their backoff included: the job comes back as one quorum."""
    from monarch_ft.controller.state import LaunchPlan

    job = Replay(tmp_path, job_step=20)
    gate = job.layout.start_gate(1)
    job.state.full_restarts, job.state.gate_since = 1, job.now
    g0, g1 = job.state.groups
    g0.move(GroupStatus.STOPPED)
    g0.move(GroupStatus.STARTING)
    g0.gate = gate  # launched, built, waiting at the gate
    g1.move(GroupStatus.STOPPED)
    g1.move(GroupStatus.WAITING)
    g1.plan = LaunchPlan(job.now + 30.0, 20, None, gate)  # its relaunch still backing off
    closed = ControlFiles(hold=True, start_gate_open=False)
    actions = job.tick(job.observe(control=closed))
    assert not [a for a in actions if isinstance(a, A.OpenStartGate)], actions


def _sampled_tick(job: Replay, turn: int, silent: set[int]) -> list:
    """A tick as the observer makes it past SAMPLED_GROUPS_PER_TICK groups: a share sampled; the
    groups not in ``silent`` step."""
    from monarch_ft.controller.observe import sampled_share

    active = [g.index for g in job.state.groups if g.active]
    share = sampled_share(active, turn)
    assert share is not None and len(share) < len(active)
    step_n = 60 + turn // 2
    reports = {g: [step(g, 0, step_n, participating_groups=active)] for g in active if g not in silent and turn % 2 == 0}
    samples = {(g, 0): ProcessSample("sleeping", 1.0) for g in share}
    return job.tick(job.observe(reports=reports, samples=samples, sampled=share))


def test_past_the_sampling_budget_a_whole_job_stall_is_still_one_stall(tmp_path):
    """130 groups, a share sampled each tick: every group silent is one job-wide stall, never a
    failure of the groups judged first."""
    job = Replay(tmp_path, groups=130, job_step=60, ft__stall_timeout_s=600.0)
    actions: list = []
    for turn in range(1, 120):
        actions += _sampled_tick(job, turn, silent=set(range(130)))
    assert len([a for a in actions if isinstance(a, A.ReportStall)]) == 1 and not [a for a in actions if isinstance(a, A.FailGroup)], [
        type(a).__name__ for a in actions if not isinstance(a, (A.Emit, A.WriteMetrics))
    ]


def test_past_the_sampling_budget_one_hung_group_is_failed_alone(tmp_path):
    job = Replay(tmp_path, groups=130, job_step=60)
    failed: list = []
    for turn in range(1, 200):
        failed += [a for a in _sampled_tick(job, turn, silent={7}) if isinstance(a, A.FailGroup)]
    assert [(a.group, a.why["reason"]) for a in failed] == [(7, "hung")], failed


# ---------------------------------------------------------------- a helper thread's change, taken by the tick
def test_a_host_returned_by_a_faults_timer_is_taken_at_the_next_tick_and_said_once(tmp_path):
    """A fault's timer (a slowdown or a slow link ended) used to pop the host from
    ``state.excluded_hosts`` in its own thread, racing the tick's save (CI: the takeover state's
    check found the host gone between the save and its check). The timer only tells; the tick
    observes it and decides ``host_returned``, once, and only for a host that was left out."""
    job = Replay(tmp_path, ft__straggler="evict")
    job.state.excluded_hosts["10.0.0.4"] = "group 1 was a link straggler there (600.0x its peers)"
    actions = job.tick(job.observe(returned_hosts=["10.0.0.4", "10.0.0.9"]))
    (back,) = emitted(actions, EventKind.HOST_RETURNED)
    assert back.fields == {"host": "10.0.0.4", "excluded_because": "group 1 was a link straggler there (600.0x its peers)"}
    assert job.state.excluded_hosts == {}
    assert emitted(job.tick(job.observe(returned_hosts=["10.0.0.4"])), EventKind.HOST_RETURNED) == []


def test_the_job_control_only_tells_a_returned_host(tmp_path):
    from monarch_ft.controller.control import JobControl

    sup = SimpleNamespace(state=JobState.new(1, str(tmp_path), {}, str(tmp_path / "gate")))
    sup.state.excluded_hosts["h"] = "slow"
    control = JobControl(sup)
    control.return_host("h")
    assert sup.state.excluded_hosts == {"h": "slow"}  # the state is the tick's to change
    assert control.take_returned_hosts() == ["h"] and control.take_returned_hosts() == []


# ---------------------------------------------------------------- where the ranks serve their state
def test_the_transport_peers_are_written_when_a_ready_rank_or_the_running_groups_change_and_only_then(tmp_path):
    job = Replay(tmp_path, groups=2, job_step=20)
    peers = lambda actions: [a.peers for a in actions if isinstance(a, A.WriteTransportPeers)]  # noqa: E731
    ready = lambda g, m: (0, RankEvent(EventKind.MODEL_READY, {"group": g, "rank": 0, "attempt": 0, "time": T0, "transport_metadata": m}))  # noqa: E731
    assert peers(job.tick(job.observe(reports={0: [ready(0, "m0")], 1: [ready(1, "m1")]}))) == [{"0": {"0": "m0"}, "1": {"0": "m1"}}]
    # Steps only: nothing they are made from changed, nothing written.
    assert peers(job.tick(job.observe(reports={0: [step(0, 0, 20)], 1: [step(1, 0, 20)]}))) == []
    # A rank ready at the address another rank had (its port reused): written, though no new address was seen.
    assert peers(job.tick(job.observe(reports={0: [ready(0, "m1")]}))) == [{"0": {"0": "m1"}, "1": {}}]
    # A group no longer running leaves the map.
    written = peers(job.tick(job.observe(exits={(1, 0): 1}))) + peers(job.tick(job.observe()))
    assert written == [{"0": {"0": "m1"}}], written


# ---------------------------------------------------------------- 7. the quorum's members, read group after group
def test_a_quorum_change_read_group_after_group_in_one_tick_is_said_once(tmp_path):
    """A tick reads group after group; where a quorum changed between steps s and s+1 and one
    read holds both steps of every group, each group's commit of s named the old members after
    the commit of s+1 named the new ones: the membership flapped twice per group (2,046
    ``quorum_change`` events for one change in the 1,024-group scale bench). Only a commit of
    the newest committed step names the quorum now."""
    job = Replay(tmp_path, groups=3, job_step=20)
    old, new = [0, 1, 2], [0, 1]
    reports = {g: [step(g, 0, 20, quorum_id=1, participating_groups=old), step(g, 0, 21, quorum_id=2, participating_groups=new)] for g in (0, 1)}
    changes = emitted(job.tick(job.observe(reports=reports)), EventKind.QUORUM_CHANGE)
    assert [c.fields["participating_groups"] for c in changes] == [new]
    assert job.state.membership == (0, 1)
    # A straggling group's commit of the older step, read a tick later, names no quorum now.
    assert emitted(job.tick(job.observe(reports={2: [step(2, 0, 20, quorum_id=1, participating_groups=old)]})), EventKind.QUORUM_CHANGE) == []
    assert job.state.membership == (0, 1)
    # The quorum changes again at the next step: said.
    changes = emitted(job.tick(job.observe(reports={0: [step(0, 0, 22, quorum_id=3, participating_groups=old)]})), EventKind.QUORUM_CHANGE)
    assert [c.fields["participating_groups"] for c in changes] == [old]
