"""The real watch loop (monarch_ft.controller.loop.Supervisor: its planner, pools, takeover and
files) driven through failure sequences on a fake clock and a fake launcher
(monarch_ft.testing.fakes): each a job of seconds to minutes of its own time, in a fraction of
a second. The assertions read the events and the job's state, as the job tests read them."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from monarch_ft.cli.jobctl import job_status, straggler_lines
from monarch_ft.controller import actions as A
from monarch_ft.controller.loop import Supervisor
from monarch_ft.controller.state import IllegalTransition
from monarch_ft.controller.standby_pool import STANDBY_NICENESS
from monarch_ft.launcher.base import LauncherTraits
from monarch_ft.launcher.slurm import node_health
from monarch_ft.records.events import GiveUpReason, GroupStatus, JobStatus
from monarch_ft.records.exits import LOST_EXIT, RankExit
from monarch_ft.records.layout import read_jsonl
from monarch_ft.testing.fakes import FakeClock, FakeLauncher, Script, fake_job_config

ERROR_A = {"error": "ValueError: bad value", "error_type": "ValueError", "frame": "monarch_ft/rank/trainer.py:10 in build", "environmental": False}
ERROR_B = {"error": "KeyError: 'x'", "error_type": "KeyError", "frame": "monarch_ft/rank/trainer.py:20 in build", "environmental": False}


# The actions of a recovery (the others: events, metrics, control files).
RECOVERY_ACTIONS = (A.FailGroup, A.StopGroup, A.PromoteStandby, A.LaunchGroup, A.LaunchStandby, A.LoseStandby, A.FindDisk)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A token file, and a listening socket as the job's external Lighthouse (ft.lighthouse_addr)."""
    folder = tmp_path_factory.mktemp("world")
    tokens = folder / "tokens.npy"
    np.save(tokens, (np.arange(4096) % 1000).astype(np.uint16))
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield str(tokens), f"127.0.0.1:{server.getsockname()[1]}"


class Job:
    """One job on the fakes: build, script, run, read back."""

    def __init__(self, tmp_path: Path, world, step_s: float = 0.1, standby_build_s: float = 0.5, fork_import_s: float = 0.3, **overrides) -> None:
        self.run_dir = str(tmp_path / "run")
        self.cfg = fake_job_config(*world, **overrides)
        self.clock = FakeClock()
        self.launcher = FakeLauncher(self.clock, self.run_dir, step_s=step_s, standby_build_s=standby_build_s, fork_import_s=fork_import_s)
        self.sup: Optional[Supervisor] = None
        # Every decision pass's (time, actions), in order.
        self.journal: list = []

    def run(self, hooks=(), **overrides) -> int:
        cfg = self.cfg
        for key, value in overrides.items():
            section, name = key.split("__")
            setattr(getattr(cfg, section), name, value)
        self.sup = Supervisor(
            cfg,
            self.run_dir,
            launcher=self.launcher,
            hooks=list(hooks),
            echo=False,
            clock=self.clock,
            fork_server=self.launcher.fork_server,
            journal=self.journal,
        )
        return self.sup.run()

    def actions(self, *kinds: type) -> list:
        """Every action of these types the loop decided, in order."""
        return [a for _, pass_ in self.journal for a in pass_ if isinstance(a, kinds)]

    def pass_with(self, pred) -> list:
        """The actions of the first decision pass holding an action ``pred`` accepts."""
        return next(actions for _, actions in self.journal if any(pred(a) for a in actions))

    def events(self, kind: str, **match) -> list[dict]:
        return [e for e in self.sup.events.events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]

    def paths(self) -> list[tuple[int, str]]:
        return [(e["group"], e["path"]) for e in self.events("recovery_path")]

    @property
    def state(self):
        return self.sup.state


class AtStep:
    """A hook: ``act(job_control)`` once the job has committed ``step`` steps."""

    def __init__(self, step: int, act) -> None:
        self.step, self.act, self.done = step, act, False

    def tick(self, job, now: float) -> None:
        if not self.done and max((r["step"] for r in job.last_commit.values()), default=-1) >= self.step:
            self.done = True
            self.act(job)


# ---------------------------------------------------------------- standby and warm fork
def test_rank_killed_a_standby_takes_over_and_a_new_one_is_built(tmp_path, world):
    job = Job(tmp_path, world, training__steps=40)
    job.launcher.script(1, 0, Script(exit_at_step=20))
    assert job.run() == 0
    assert job.paths() == [(1, "standby")]
    # The tick that saw the exit: the group failed (its rank stopped), the ready standby promoted
    # in its place with its state from the live peer, and the replacement standby launched.
    tick = job.pass_with(lambda a: isinstance(a, A.FailGroup))
    acts = [a for a in tick if isinstance(a, RECOVERY_ACTIONS)]
    assert [type(a).__name__ for a in acts] == ["FailGroup", "PromoteStandby", "LaunchStandby"], acts
    failed, promoted = acts[0], acts[1]
    assert (failed.group, failed.attempt, failed.why["reason"]) == (1, 0, "exit") and failed.stacks_tag is None
    assert (promoted.standby, promoted.group, promoted.attempt, promoted.decision.source.value) == (0, 1, 1, "peer")
    promoted = job.events("standby_promoted")
    assert [(e["standby"], e["group"], e["attempt"]) for e in promoted] == [(0, 1, 1)]
    scheduled = job.events("restart_scheduled", group=1)
    assert [(e["action"], e["backoff_s"]) for e in scheduled] == [("promote", 0.0)]
    # The replacement: launched after the promotion and built while the job trains.
    assert [e["standby"] for e in job.events("standby_launched")] == [0, 1]
    assert [e["standby"] for e in job.events("standby_ready")] == [0, 1]
    assert job.events("state_source", group=1)[0]["source"] == "peer"
    g1 = job.state.groups[1]
    assert (g1.status, g1.attempt, g1.restarts) == (GroupStatus.DONE, 1, 1)
    assert job.state.standby.promoted == 1 and job.state.standby.launched == 2
    assert job.sup.summary()["standby"]["promoted"] == 1 and job.state.status == JobStatus.COMPLETED


def test_a_second_fault_while_the_standby_is_rebuilt_goes_warm_fork(tmp_path, world):
    job = Job(tmp_path, world, standby_build_s=2.0, training__steps=60)
    job.launcher.script(0, 0, Script(exit_at_step=30))
    job.launcher.script(1, 0, Script(exit_at_step=35))  # the replacement standby needs 20 steps' time
    assert job.run() == 0
    assert job.paths() == [(0, "standby"), (1, "warm_fork")]
    assert job.events("fork_server_ready") and not job.events("recovery_path", path="cold_start")
    assert [e["action"] for e in job.events("restart_scheduled")] == ["promote", "relaunch"]
    assert job.events("state_source", group=1)[0]["source"] == "peer"
    # The relaunch: forked, as the planner decided at its launch, at its own launch gate.
    (relaunch,) = [a for a in job.actions(A.LaunchGroup) if a.attempt > 0]
    assert (relaunch.group, relaunch.warm, type(relaunch.relaunch).__name__) == (1, True, "WarmFork") and relaunch.gate.endswith("launch.g1.a1")


def test_a_fault_right_after_a_promotion_is_recovered_again(tmp_path, world):
    job = Job(tmp_path, world, standby_build_s=1.0, training__steps=50)
    job.launcher.script(1, 0, Script(exit_at_step=20))
    job.launcher.script(1, 1, Script(exit_at_step=0))  # the promoted standby dies at its first step
    assert job.run() == 0
    assert job.paths() == [(1, "standby"), (1, "warm_fork")]
    failed = job.events("group_failed", group=1)
    assert [e["attempt"] for e in failed] == [0, 1]
    # Killed, not an error at start-up: no crash loop; both relaunches counted.
    assert not job.events("crash_loop") and job.state.groups[1].restarts == 2 and job.state.groups[1].attempt == 2


def test_the_first_launch_waits_for_the_fork_server_and_forks(tmp_path, world):
    job = Job(tmp_path, world, fork_import_s=3.0, training__steps=20)
    assert job.run() == 0
    ready = job.events("fork_server_ready")[0]["time"]
    launched = job.events("group_launched")
    # Both groups waited for the server (3 s of imports), then were forked from it.
    assert [(e["group"], e["attempt"], e["forked"]) for e in launched] == [(0, 0, True), (1, 0, True)]
    assert all(e["time"] >= ready for e in launched) and "cold_because" not in launched[0]
    assert not job.events("recovery_path")  # a first launch is not a recovery


def test_the_fork_server_still_importing_starts_cold_and_a_failed_fork_is_decided_again(tmp_path, world):
    job = Job(tmp_path, world, fork_import_s=70.0, ft__standby_groups=0, training__steps=165)
    job.launcher.script(1, 0, Script(exit_at_step=5))  # the server imports for 70 s: not ready yet

    def refuse(_job):
        job.launcher.fork_error = "the fork server refused: out of memory"
        job.launcher.kill(1)

    assert job.run(hooks=[AtStep(150, refuse)]) == 0  # step 150: ~75 s, the server is ready
    # The first launch waited FIRST_LAUNCH_WAIT_S for the server, then started cold.
    launched = job.events("group_launched", attempt=0)
    assert [(e["forked"], e["cold_because"]) for e in launched] == [(False, "the fork server on its host was still importing after 60 s")] * 2
    first, second = job.events("recovery_path", group=1)
    assert (first["path"], first["cold_because"]) == ("cold_start", "the fork server is still importing")
    assert "planned" not in first
    # Ready by then, but the fork fails at launch: the planner's second decision, recorded.
    assert (second["path"], second["cold_because"], second["planned"]) == ("cold_start", "the fork server refused: out of memory", "warm_fork")
    assert job.state.groups[1].status == GroupStatus.DONE


def test_a_fork_server_started_while_the_job_trains_imports_below_the_ranks(tmp_path, world):
    job = Job(tmp_path, world, training__steps=40)

    def lose_server(_job):
        job.launcher.servers[0].gone = True

    assert job.run(hooks=[AtStep(20, lose_server)]) == 0
    first, second = job.launcher.servers[:2]
    # At launch nothing trains yet: its imports race only the first ranks' own. Restarted
    # mid-job (a lost one, or a new host's), it yields the CPU to the training ranks.
    assert (first.niceness, second.niceness) == (0, STANDBY_NICENESS)


# ---------------------------------------------------------------- the job's state
def test_every_group_lost_rolls_back_to_the_newest_checkpoint(tmp_path, world):
    job = Job(tmp_path, world, checkpoint__enable=True, checkpoint__interval=10, ft__standby_groups=0, training__steps=50)
    for g in (0, 1):
        job.launcher.script(g, 0, Script(exit_at_step=25))
    assert job.run() == 0
    actions = {e["group"]: e["action"] for e in job.events("restart_scheduled")}
    # Both seen dead in one tick: neither counts the other as a live peer.
    assert actions == {0: "disk_rollback", 1: "disk_rollback"}
    # The tick's first pass stopped both and asked for the disk; its second pass, the disk found,
    # scheduled both relaunches; the relaunches load the checkpoint step found.
    first = [a for a in job.pass_with(lambda a: isinstance(a, A.FailGroup)) if isinstance(a, RECOVERY_ACTIONS)]
    assert [(type(a).__name__, getattr(a, "group", None)) for a in first] == [("FailGroup", 0), ("FailGroup", 1), ("FindDisk", None)], first
    assert first[2].at_most == 25
    launches = job.actions(A.LaunchGroup)
    assert [(a.group, a.attempt, a.load_step) for a in launches[-2:]] == [(0, 1, None), (1, 1, None)], launches
    (rollback,) = job.events("job_rollback")
    assert (rollback["from_step"], rollback["to_step"], rollback["steps_lost"]) == (25, 20, 5)
    assert {e["source"] for e in job.events("state_source")} <= {"disk", "peer"} and job.events("state_source", source="disk")
    summary = job.sup.summary()
    assert summary["steps_lost"] == 5 and summary["job_step"] == 50
    assert job.state.rollbacks == [{k: v for k, v in rollback.items() if k not in ("time", "event")}]


def test_a_standby_promoted_when_every_group_died_at_once_loads_the_checkpoint(tmp_path, world):
    """Two groups dead in one tick (every rank refusing a commit below the job's step): the
    first one's standby must not be told to heal from the second, dead but judged later in
    the tick (it joined a quorum alone at step 0 and refused its commits: CI at c77c81d)."""
    job = Job(tmp_path, world, checkpoint__enable=True, checkpoint__interval=10, training__steps=50)
    for g in (0, 1):
        job.launcher.script(g, 0, Script(exit_at_step=25, exit_code=int(RankExit.COMMIT_BELOW_FLOOR)))
    assert job.run() == 0
    assert [e["standby"] for e in job.events("standby_promoted", group=0)] == [0]
    sources = [(e["group"], e["attempt"], e["source"]) for e in job.events("state_source")]
    # Group 1 is relaunched once group 0 steps again, from the checkpoint: it heals from it.
    assert sources[0] == (0, 1, "disk") and (1, 1) in {s[:2] for s in sources}, sources
    (promoted,) = job.actions(A.PromoteStandby)
    assert (promoted.group, promoted.decision.source.value, promoted.decision.step) == (0, "disk", 20)
    assert [(e["from_step"], e["to_step"]) for e in job.events("job_rollback")] == [(25, 20)]
    assert len(job.events("group_failed")) == 2 and job.state.status == JobStatus.COMPLETED


def test_every_group_dead_at_once_with_no_checkpoint_stops_with_one_line(tmp_path, world, capsys):
    """Both groups seen dead in one tick, no checkpoint: the first failure finds the job's
    state lost; the second adds no second error line and no relaunch (CI at 7cc2b57)."""
    job = Job(tmp_path, world, checkpoint__enable=False, ft__standby_groups=0, training__steps=50)
    for g in (0, 1):
        job.launcher.script(g, 0, Script(exit_at_step=25))
    assert job.run() == 1
    assert len(job.events("group_failed")) == 2 and len(job.events("job_state_lost")) == 1
    assert not job.events("restart_scheduled") and job.state.status == JobStatus.FAILED
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and "checkpoint" in errors[0], errors


def test_a_checkpoint_that_fails_to_load_is_quarantined_and_its_relaunch_not_charged(tmp_path, world):
    job = Job(tmp_path, world, checkpoint__enable=True, checkpoint__interval=10, ft__standby_groups=0, training__steps=50)
    for g in (0, 1):
        job.launcher.script(g, 0, Script(exit_at_step=25))
    job.launcher.script(0, 1, Script(load_fails=True))
    job.launcher.script(1, 1, Script(load_fails=True))
    assert job.run() == 0
    quarantined = job.events("checkpoint_quarantined")
    assert quarantined and all(q["step"] == 20 and q["problem"].startswith("failed to load") for q in quarantined)
    exits = [e for e in job.events("group_failed") if e.get("exit_code") == RankExit.CHECKPOINT_LOAD_FAILED]
    assert exits, job.events("group_failed")
    uncounted = [e for e in job.events("restart_scheduled") if e.get("counted") is False]
    assert len(uncounted) == len(exits)
    assert 20 in job.state.unloadable
    # The next older step, loaded instead; each group's one counted restart is its first failure.
    assert job.events("job_rollback")[-1]["to_step"] == 10
    assert [g.restarts for g in job.state.groups] == [1, 1]


# ---------------------------------------------------------------- silent data corruption (controller.integrity)
def test_a_corrupt_replica_of_three_is_failed_and_heals_from_the_majority(tmp_path, world):
    job = Job(tmp_path, world, ft__replica_groups=3, training__steps=40)
    job.launcher.script(2, 0, Script(corrupt_from_step=20))
    assert job.run() == 0
    (sdc,) = job.events("sdc_detected")
    assert (sdc["group"], sdc["attempt"], sdc["step"], sdc["state_step"], sdc["action"]) == (2, 0, 20, 21, "fail_group")
    assert sdc["majority"] == [0, 1] and sdc["tensors"] == ["#1"] and sdc["trusted_step"] == 20
    # Through the planner as any failed group: a standby takes its place and heals from a peer.
    assert [e["reason"] for e in job.events("group_failed", group=2)] == ["corrupt"]
    assert job.paths() == [(2, "standby")] and not job.events("full_restart")
    assert (2, 0) in job.state.integrity.condemned and job.state.integrity.last_agreed[2] >= 21
    assert [g.status for g in job.state.groups] == [GroupStatus.DONE] * 3


def test_two_replicas_that_disagree_roll_the_job_back_to_their_last_agreed_checkpoint(tmp_path, world):
    job = Job(tmp_path, world, checkpoint__enable=True, checkpoint__interval=10, training__steps=50)
    job.launcher.script(1, 0, Script(corrupt_from_step=25))
    assert job.run() == 0
    (sdc,) = job.events("sdc_detected")
    assert (sdc["groups"], sdc["action"], sdc["trusted_step"]) == ([0, 1], "rollback", 25)
    # The planner's FullRestart, from no checkpoint newer than the step the replicas last agreed on.
    (full,) = job.events("full_restart")
    assert (full["reason"], full["resume_step"], full["failed_group"]) == ("replicas_diverged", 20, None)
    (rollback,) = job.events("job_rollback")
    assert (rollback["reason"], rollback["to_step"]) == ("replicas_diverged", 20)
    assert not job.events("group_failed") and [g.attempt for g in job.state.groups] == [1, 1]
    assert job.state.integrity.start_step == 25 and job.sup.summary()["job_step"] == 50


def test_a_job_wide_stall_is_escalated_to_a_full_restart(tmp_path, world):
    job = Job(
        tmp_path,
        world,
        checkpoint__enable=True,
        checkpoint__interval=10,
        ft__hang_timeout_s="2",
        ft__timeout_s=1.0,
        ft__stall_timeout_s=2.0,
        training__steps=40,
    )
    for g in (0, 1):
        job.launcher.script(g, 0, Script(hang_at_step=25))
    assert job.run() == 0
    (stall,) = job.events("job_stall")
    assert stall["groups"] == [0, 1]
    assert job.events("job_stall_escalated")
    (full,) = job.events("full_restart")
    assert (full["reason"], full["resume_step"], full["failed_group"]) == ("job_stall", 20, None)
    assert not job.events("group_failed")  # nothing killed one by one
    assert job.state.full_restarts == 1 and [g.attempt for g in job.state.groups] == [1, 1]
    assert [r["steps_lost"] for r in job.state.rollbacks] == [5]


def test_full_restart_mode_restarts_every_group_from_the_checkpoint(tmp_path, world):
    job = Job(tmp_path, world, checkpoint__enable=True, checkpoint__interval=10, ft__recovery="full_restart", training__steps=40)
    job.launcher.script(1, 0, Script(exit_at_step=25))
    assert job.run() == 0
    (full,) = job.events("full_restart")
    assert (full["reason"], full["resume_step"], full["failed_group"]) == ("full_restart", 20, 1)
    assert job.events("group_stopped", group=0, reason="full_restart")
    paths = job.events("recovery_path")
    assert [(p["group"], p["path"]) for p in paths] == [(0, "cold_start"), (1, "cold_start")]
    assert all(p["cold_because"].startswith("ft.recovery=full_restart") for p in paths)
    assert not job.events("standby_launched") and not job.launcher.servers
    assert job.events("training_started", full_restarts=1)


# ---------------------------------------------------------------- giving up
def test_a_crash_loop_is_given_up_after_two_identical_startup_failures(tmp_path, world):
    job = Job(tmp_path, world, training__steps=30)
    job.launcher.script(1, 0, Script(startup_error=ERROR_A))
    job.launcher.script(1, 1, Script(startup_error=ERROR_B))  # another failure: not a loop yet
    job.launcher.script(1, 2, Script(startup_error=ERROR_B))
    assert job.run() == 1
    (loop,) = job.events("crash_loop")
    assert (loop["group"], loop["attempt"], loop["error_type"], loop["frame"]) == (1, 2, "KeyError", ERROR_B["frame"])
    g1 = job.state.groups[1]
    assert (g1.status, g1.gave_up, g1.attempt) == (GroupStatus.GIVEN_UP, GiveUpReason.CRASH_LOOP, 2)
    assert job.state.groups[0].status == GroupStatus.DONE and job.state.status == JobStatus.DEGRADED


def test_the_restart_budget_is_a_rate_spent_within_its_window_only(tmp_path, world):
    within = Job(tmp_path / "within", world, ft__max_restarts=2, ft__restart_window_s=60.0, training__steps=60)
    for attempt, step in enumerate((10, 20, 30)):
        within.launcher.script(1, attempt, Script(exit_at_step=step))
    assert within.run() == 1
    (spent,) = within.events("restart_budget_exhausted")
    assert (spent["group"], spent["recent_restarts"], spent["max_restarts"]) == (1, 2, 2)
    assert within.state.groups[1].gave_up == GiveUpReason.RESTART_BUDGET

    across = Job(tmp_path / "across", world, ft__max_restarts=2, ft__restart_window_s=1.5, training__steps=60)
    for attempt, step in enumerate((10, 30, 50)):  # 2 s apart: each window holds one relaunch
        across.launcher.script(1, attempt, Script(exit_at_step=step))
    assert across.run() == 0
    assert not across.events("restart_budget_exhausted") and across.state.groups[1].restarts == 3


# ---------------------------------------------------------------- takeover
def test_a_rank_lost_while_no_controller_watched_fails_its_group_at_takeover(tmp_path, world):
    job = Job(tmp_path, world, training__steps=60)
    assert job.run(hooks=[AtStep(15, lambda _job: job.sup.request_detach())]) == 0
    assert job.state.status == JobStatus.DETACHED and job.events("controller_detached")
    before = job.state
    job.launcher.kill(1)  # while nobody supervises
    job.clock.advance(3.0)
    assert job.run(controller__attach=True) == 0
    (attached,) = job.events("controller_attached")
    assert attached["groups"] == {0: "adopt", 1: "fail"}
    (lost,) = job.events("group_failed", group=1)
    assert (lost["reason"], lost["ranks"], lost["attempt"]) == ("lost_while_unsupervised", [0], 0)
    # What the first controller knew came over whole: group 0's attempt, the committed steps.
    state = job.state
    assert state is not before and state.groups[0].attempt == 0 and state.groups[1].attempt == 1
    assert state.job_step == 60 and state.status == JobStatus.COMPLETED
    assert job.sup.summary()["controller"]["controllers"] == 2


def test_a_group_status_changes_only_by_an_allowed_transition(tmp_path, world):
    job = Job(tmp_path, world, training__steps=10)
    assert job.run() == 0
    g = job.state.groups[0]
    with pytest.raises(IllegalTransition):
        g.status = GroupStatus.WAITING
    with pytest.raises(IllegalTransition):
        g.move(GroupStatus.RUNNING)  # done is final


# ---------------------------------------------------------------- a cluster's nodes
class NodesLauncher(FakeLauncher):
    """The fakes on a cluster of nodes ``n0``, ``n1``, ...: each group's launch goes to the first
    node (by name) with nothing running on it that the controller did not exclude, as a
    scheduler would place it; ``node_states`` is the scheduler's view (it counts a node up all
    along here: a node whose ranks vanished is suspected by the controller alone)."""

    traits = LauncherTraits(adoptable=True, forkable=False, default_standby_groups=1)

    def __init__(self, *args, nodes: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.states = {f"n{i}": "idle" for i in range(nodes)}
        self.excluded: set[str] = set()
        self.placed: list[dict] = []

    def launch_group(self, ranks):
        busy = {r.launch.host for r in self.ranks if r.code is None}
        node = next(n for n in sorted(self.states) if n not in busy | self.excluded)
        for launch in ranks:
            launch.host = node
        self.placed.append({"group": ranks[0].group, "standby": ranks[0].standby, "attempt": ranks[0].attempt, "job_id": str(len(self.placed)), "node": node})
        return super().launch_group(ranks)

    def node_fails(self, node: str) -> None:
        """The node goes as a machine does: every rank on it gone without a word (LOST_EXIT)."""
        for r in self.ranks:
            if r.code is None and r.launch.host == node:
                r.code = LOST_EXIT

    def take_placements(self) -> list[dict]:
        out, self._taken = self.placed[getattr(self, "_taken", 0) :], len(self.placed)
        return out

    def node_states(self) -> dict[str, str]:
        return dict(self.states)

    def node_health(self, state: str):
        return node_health(state)

    def exclude_nodes(self, nodes: set[str]) -> None:
        self.excluded = set(nodes)


def test_a_node_down_its_group_relaunched_elsewhere_the_node_excluded_then_back_after_probation(tmp_path, world):
    # No standby: the relaunch's own placement is what is watched (a promotion takes a node
    # already placed; tests/jobs/test_launcher_slurm.py covers it on real Slurm).
    job = Job(tmp_path, world, training__steps=60, ft__standby_groups=0, ft__node_probation_s=2.0)
    job.launcher = launcher = NodesLauncher(job.clock, job.run_dir, step_s=0.1)
    launcher.script(1, 1, Script(exit_at_step=40))  # a process fault of the relaunch, after the node returned
    assert job.run(hooks=[AtStep(10, lambda _: launcher.node_fails("n1"))]) == 0
    placed = [(p["group"], p["attempt"], p["node"]) for p in launcher.placed]
    # g1 was on n1: relaunched on n2 (n1 first free by name, but excluded); after its return
    # (never counted down by the scheduler: after ft.node_probation_s), the next relaunch uses it.
    assert placed == [(0, 0, "n0"), (1, 0, "n1"), (1, 1, "n2"), (1, 2, "n1")], placed
    (excluded,) = job.events("node_excluded")
    assert (excluded["node"], excluded["reason"], excluded["group"], excluded["attempt"], excluded["excluded"]) == ("n1", "ranks_lost", 1, 0, ["n1"])
    (returned,) = job.events("node_returned")
    assert returned["node"] == "n1" and returned["reason"] == "never_down" and returned["excluded_s"] >= 2.0
    assert len(job.events("group_placed")) == 4 and launcher.excluded == set()
    # The process fault excluded nothing; the relaunch's exclusion came from the planner's action.
    restarts = job.events("restart_scheduled", group=1)
    assert [r["action"] for r in restarts] == ["relaunch", "relaunch"]
    summary = job.sup.summary()["nodes"]
    assert [(x["node"], x["reason"], x["return_reason"]) for x in summary["exclusions"]] == [("n1", "ranks_lost", "never_down")]
    assert summary["excluded_now"] == [] and summary["placements"] == 4


# ---------------------------------------------------------------- fail-slow groups
def test_a_slow_group_is_named_and_under_evict_replaced_by_the_standby_once(tmp_path, world):
    # A fake step is 0.1 s: the straggler costs 0.1 s a step (0.3 s against its peers' 0.1),
    # 7 s over the steps left, more than 2 s, once it has cost 2 s (20 of its steps).
    job = Job(tmp_path, world, training__steps=130, ft__replica_groups=3, ft__straggler="evict", ft__straggler_recovery_s=2.0)
    job.launcher.script(1, 0, Script(slow_at_step=40, slow_factor=3.0))  # only its first attempt is slow
    assert job.run() == 0
    (found,) = job.events("straggler_detected")
    assert (found["group"], found["slow_kind"], found["attempt"]) == (1, "cpu", 0) and found["ratio"] > job.cfg.ft.straggler_factor
    # Named within the window: 3x its peers is far slower (2 x ft.straggler_factor), named once 8
    # of its last ft.straggler_window steps were slow (steps 38-47, 40-47 slow).
    assert found["steps"] == [38, 47] and found["ratio"] == 3.0
    # Kept while it has cost less than one recovery since it was named (the window's 10 steps
    # at 0.1 s each: 1 s of 2), evicted once it has (steps 38-57).
    (kept,) = job.events("straggler_kept")
    assert (kept["group"], kept["why"]) == (1, "not_slow_long_enough") and kept["because"].startswith("it has cost 1.0 s since it was named"), kept
    (evicted,) = job.events("straggler_evicted")
    assert evicted["group"] == 1 and evicted["loss_s"] > evicted["cost_s"] == 2.0 and evicted["time"] > kept["time"]
    last = max(m["step"] for m in read_jsonl(os.path.join(job.run_dir, "metrics.jsonl")) if m["group"] == 1 and m["attempt"] == 0)
    assert last >= 57, last
    assert [(e["group"], e["reason"]) for e in job.events("group_failed")] == [(1, "straggler")]
    assert job.paths() == [(1, "standby")]
    assert job.state.status == JobStatus.COMPLETED
    (line,) = job_status(job.run_dir).stragglers
    assert (
        line.startswith("group 1 (attempt 0) cpu straggler, 3.0x its peers: rank 0 0.150 s/step, median 0.050 s, steps 38-47") and ": evicted, it costs" in line
    )


def test_a_burst_of_slowness_a_window_long_is_kept_under_evict_and_cleared(tmp_path, world):
    # Group 1 computes 3x slower for 12 steps only (a burst of load: the scheduler leaving it a
    # shared core for a while), with a standby ready and evicting it paying over the steps left:
    # named (steps 38-47), kept while it has cost less than one recovery (named until step 53,
    # 8 of its last 10 steps slow: 16 steps x 0.1 s < 2 s), cleared once a window of its steps
    # is at its peers' pace again; never evicted. (Weighing the steps left alone evicted such a
    # group in two straggler drills beside CPU hogs.)
    job = Job(tmp_path, world, training__steps=130, ft__replica_groups=3, ft__straggler="evict", ft__straggler_recovery_s=2.0)
    job.launcher.script(1, 0, Script(slow_at_step=40, slow_until_step=52, slow_factor=3.0))
    assert job.run() == 0
    (found,) = job.events("straggler_detected")
    assert (found["group"], found["slow_kind"]) == (1, "cpu")
    (kept,) = job.events("straggler_kept")
    assert kept["why"] == "not_slow_long_enough" and kept["time"] >= found["time"], kept
    (cleared,) = job.events("straggler_cleared")
    assert cleared["group"] == 1 and cleared["time"] > kept["time"]
    assert job.events("straggler_evicted") == job.events("group_failed") == [] and job.paths() == []
    assert job.state.status == JobStatus.COMPLETED


def test_status_tells_what_became_of_each_straggler():
    def detected(group, attempt):
        return {
            "event": "straggler_detected",
            "group": group,
            "attempt": attempt,
            "slow_kind": "cpu",
            "ratio": 3.1,
            "rank": 1,
            "seconds": 0.25,
            "median_s": 0.08,
            "steps": [40, 49],
        }

    events = [
        detected(1, 0),
        {"event": "straggler_kept", "group": 1, "because": "no standby is ready to take its place"},
        {"event": "straggler_evicted", "group": 1, "because": "it costs 20.0 s over the 100 steps left, more than one recovery (10.0 s)"},
        detected(2, 0),
        {"event": "straggler_cleared", "group": 2},
        detected(0, 3),
        {"event": "straggler_kept", "group": 0, "because": "ft.straggler=report"},
    ]
    lines = straggler_lines(events)
    assert lines[0] == (
        "group 1 (attempt 0) cpu straggler, 3.1x its peers: rank 1 0.250 s/step, median 0.080 s, steps 40-49: "
        "evicted, it costs 20.0 s over the 100 steps left, more than one recovery (10.0 s)"
    )
    assert lines[1].endswith("steps 40-49: back to its peers' pace") and lines[2].endswith(": kept, ft.straggler=report")


def test_a_slow_group_under_report_is_named_once_and_kept(tmp_path, world):
    job = Job(tmp_path, world, training__steps=120, ft__replica_groups=3)
    job.launcher.script(1, 0, Script(slow_at_step=40, slow_factor=3.0))
    assert job.cfg.ft.straggler == "report"  # the default
    assert job.run() == 0
    assert [(e["group"], e["slow_kind"]) for e in job.events("straggler_detected")] == [(1, "cpu")]
    assert job.events("straggler_evicted") == job.events("group_failed") == job.events("straggler_kept") == []


def test_evict_keeps_a_straggler_when_no_standby_is_ready(tmp_path, world):
    # No standby (the point of the test): eviction would cost a relaunch on the same host.
    job = Job(tmp_path, world, training__steps=120, ft__replica_groups=3, ft__straggler="evict", ft__standby_groups=0)
    job.launcher.script(1, 0, Script(slow_at_step=40, slow_factor=3.0))
    assert job.run() == 0
    (kept,) = job.events("straggler_kept")  # said once, not every tick
    assert kept["group"] == 1 and kept["why"] == "no_standby" and "no standby" in kept["because"] and job.events("group_failed") == []


def test_status_json_has_the_text_forms_fields(tmp_path, world, capsys):
    """``monarch-ft status RUN --json``: one JSON object with the fields the text form shows."""
    import json

    from monarch_ft.cli.jobctl import format_status
    from monarch_ft.cli.main import main

    job = Job(tmp_path, world, training__steps=20)
    job.launcher.script(1, 0, Script(exit_at_step=10))
    assert job.run() == 0
    assert main(["status", job.run_dir, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    text = format_status(job_status(job.run_dir))
    assert shown["status"] == "completed" and f"job {shown['run_dir']}: completed, job step {shown['job_step']}" in text
    assert [(g["index"], g["state"], g["restarts"]) for g in shown["groups"]] == [(0, "done", 0), (1, "done", 1)]
    assert shown["ended"] in text and shown["standby"]["recoveries"]["standby"] == 1
