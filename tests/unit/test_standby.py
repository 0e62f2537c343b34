"""Warm standby groups: the pure decisions and the pool's bookkeeping (fast, no real jobs).

The real-process checks (a promotion with bit-identical weights, a standby killed while
waiting, a second fault taking the cold path) are in tests/jobs/test_standby_jobs.py.
"""

from __future__ import annotations

import json
import os

import pytest

from monarch_ft.config.ft import standby_config_error
from monarch_ft.controller.standby_pool import (
    MAX_FAILED_BUILDS,
    UnreadyClock,
    build_promotion,
    recovery_path,
    resolve_standby_groups,
    standby_loss,
    standbys_to_launch,
)
from monarch_ft.rank.standby_wait import promoted_spec
from monarch_ft.rank.trainer import RankSpec
from monarch_ft.records.decisions import Promotion, StateDecision, StateSource
from monarch_ft.records.events import EventKind, RecoveryPath, StandbyStatus
from monarch_ft.records.layout import RunLayout


def _default(launcher: str) -> int:
    """The launcher's default (its traits, read without building it); local_hosts is local with simulated hosts."""
    from monarch_ft.config.launcher import LauncherConfig
    from monarch_ft.launcher import launcher_traits

    if launcher == "local_hosts":
        return launcher_traits(LauncherConfig(name="local", options={"simulated_hosts": True})).default_standby_groups
    return launcher_traits(LauncherConfig(name=launcher)).default_standby_groups


def test_defaults_per_launcher_and_full_restart_uses_none():
    assert resolve_standby_groups(None, _default("local"), "live") == 1
    assert resolve_standby_groups(None, _default("local_hosts"), "live") == 1
    assert resolve_standby_groups(None, _default("slurm"), "live") == 0
    assert resolve_standby_groups(None, _default("monarch"), "live") == 0
    assert resolve_standby_groups(2, _default("local"), "live") == 2
    assert resolve_standby_groups(2, _default("local"), "full_restart") == 0


def test_config_errors_name_the_fix():
    assert standby_config_error(None, "slurm") is None
    assert standby_config_error(0, "monarch") is None
    # Every launcher runs standbys; on slurm and monarch (default 0) K > 0 is the user's choice.
    for launcher in ("local", "local_hosts", "slurm", "monarch"):
        assert standby_config_error(1, launcher) is None
    assert "must be >= 0" in standby_config_error(-1, "local")


def test_a_waiting_standby_gives_up_when_its_controller_is_gone(tmp_path):
    from monarch_ft.rank.standby_wait import ControllerWatch, orphan_after_s, standby_orphaned, wait_for_promotion
    from monarch_ft.records.layout import atomic_write_json

    # Much sooner than a training rank's lease, never later.
    assert orphan_after_s(1.0, 600.0) == 10.0 and orphan_after_s(5.0, 600.0) == 50.0 and orphan_after_s(5.0, 20.0) == 20.0
    assert standby_orphaned(None, None, 7, 100.0, 10.0) is None  # no heartbeat yet: nothing decided
    assert standby_orphaned(95.0, 7, 7, 100.0, 10.0) is None
    assert "heartbeat" in standby_orphaned(85.0, 7, 7, 100.0, 10.0)
    assert "replaced by 8" in standby_orphaned(99.0, 8, 7, 100.0, 10.0)  # a controller that attached
    # The real files: a fresh heartbeat of the launching controller keeps it waiting; another
    # controller's heartbeat ends the wait at once, with the reason instead of a promotion.
    beat = tmp_path / "controller"
    atomic_write_json(str(beat), {"pid": 111, "time": 0})
    watch = ControllerWatch(str(beat), stale_s=10.0, check_every_s=0.0)
    assert watch.launched_by == 111 and watch.gone() is None
    atomic_write_json(str(beat), {"pid": 222, "time": 0})
    assert "replaced by 222" in wait_for_promotion(str(tmp_path / "promote.json"), poll_s=0.001, orphaned=watch.gone)
    os.utime(beat, (1.0, 1.0))  # stale
    assert "no controller heartbeat" in ControllerWatch(str(beat), stale_s=10.0, check_every_s=0.0).gone()


def test_local_launcher_applies_a_ranks_niceness_to_its_process(tmp_path):
    import sys

    from monarch_ft.launcher.base import RankLaunch
    from monarch_ft.launcher.local import LocalLauncher

    code = "import os; print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))"
    base = os.getpriority(os.PRIO_PROCESS, 0)
    outs = []
    for niceness in (0, 10):
        log = tmp_path / f"n{niceness}.log"
        launch = RankLaunch(0, 0, 0, [sys.executable, "-c", code], dict(os.environ), str(log), str(tmp_path), niceness=niceness, die_with_controller=True)
        (p,) = LocalLauncher().launch_group([launch])
        assert p.wait(30) == 0
        outs.append(tuple(int(x) for x in log.read_text().split()))
    # argv stays the rank's own command; a standby builds in the background (SCHED_IDLE too).
    assert outs == [(base, os.SCHED_OTHER), (min(19, base + 10), os.SCHED_IDLE)]


def test_no_standby_before_the_groups_are_up_nor_when_finishing():
    assert standbys_to_launch(1, 0, training_started=False, job_finishing=False) == 0
    assert standbys_to_launch(1, 0, training_started=True, job_finishing=True) == 0
    assert standbys_to_launch(2, 1, training_started=True, job_finishing=False) == 1
    assert standbys_to_launch(1, 1, training_started=True, job_finishing=False) == 0
    # A build that keeps failing is not retried forever.
    assert standbys_to_launch(1, 0, True, False, failed_builds=MAX_FAILED_BUILDS) == 0


def test_a_dead_or_stopped_standby_is_lost():
    assert standby_loss([None, None]) is None
    assert standby_loss([None, None], ["sleeping", "running"]) is None
    assert "rank 1 exited" in standby_loss([None, -9])
    assert "stopped" in standby_loss([None, None], ["sleeping", "stopped"])
    assert "zombie" in standby_loss([None, None], ["zombie", "sleeping"])


def test_recovery_path_choice():
    assert recovery_path("live", True) is RecoveryPath.STANDBY
    assert recovery_path("live", False) is RecoveryPath.COLD_START
    assert recovery_path("full_restart", True) is RecoveryPath.COLD_START


def test_unready_clock_counts_uncovered_training_time_only():
    c = UnreadyClock(1)
    c.update(0.0, ready=0, counting=False)  # before training: not counted
    c.update(10.0, ready=0, counting=True)
    c.update(15.0, ready=1, counting=True)
    assert c.seconds(20.0) == pytest.approx(5.0)
    c.update(30.0, ready=0, counting=True)  # promoted: uncovered again
    assert c.seconds(32.0) == pytest.approx(7.0) and c.spells == 2
    assert UnreadyClock(0).seconds(100.0) == 0.0


def test_promotion_carries_the_groups_identity_and_the_state_decision(tmp_path):
    layout = RunLayout(str(tmp_path))
    p = build_promotion(layout, standby=3, group=1, attempt=2, ranks=2, decision=StateDecision(StateSource.DISK, 40), now=5.0)
    p = Promotion.from_record(json.loads(json.dumps(p.to_record())))  # what the rank reads back from the file
    assert p.replica_id == "group_1" and p.decision == StateDecision(StateSource.DISK, 40)
    assert p.ranks["1"]["report_path"] == layout.report(1, 1, 2)
    assert p.ranks["1"]["scratch_dir"] == layout.scratch(1, 1)
    spec = RankSpec(
        config={},
        group=5,
        rank=1,
        world_size=2,
        attempt=0,
        store_host="h",
        store_port=1,
        lighthouse_addr="l",
        advertise_host="h",
        run_dir=str(tmp_path),
        report_path=layout.standby_report(3, 1),
        hold_path="",
        tokens_path="",
        promotion_path=layout.promotion(3),
        standby=3,
    )
    mine = promoted_spec(spec, p)
    assert (mine.group, mine.attempt, mine.report_path, mine.scratch_dir) == (1, 2, layout.report(1, 1, 2), layout.scratch(1, 1))
    # The standby's own store, host and transport stay: its peers reach it where it is.
    assert (mine.store_host, mine.advertise_host, mine.promotion_path) == ("h", "h", "")


class PoolWorld:
    """The pool's decisions (monarch_ft.controller.decide.pools) driven tick by tick on hand-made
    observations, the executor's part played here: a LaunchStandby gets ranks, a LoseStandby's
    ranks are killed. The tests assert on the actions each tick returns."""

    def __init__(self, wanted: int = 1, first_number: int = 0) -> None:
        from monarch_ft.controller.state import JobState

        self.state = JobState.new(1, "/run", {}, "gate")
        pool = self.state.standby
        pool.wanted = pool.clock.wanted = wanted
        pool.first_slot, pool.first_number = 2, first_number
        self.launched: list[tuple[int, int]] = []
        self.ready: set[tuple[int, int]] = set()  # (standby, rank) that reported standby_ready, not read yet
        self.exits: dict[tuple[int, int], int] = {}
        self.os: dict[tuple[int, int], str] = {}

    def tick(self, now: float, training: bool = True, claim=None):
        """One pass: the standbys' reports and exits, a claim (``claim``: a standby number), the
        launches; returns (the actions, the claimed standby)."""
        from types import SimpleNamespace

        from monarch_ft.controller.actions import LaunchStandby, LoseStandby
        from monarch_ft.controller.decide import pools
        from monarch_ft.controller.decide.base import Decision, Facts, Tick
        from monarch_ft.controller.observe import Observations
        from monarch_ft.records.report_records import RankEvent

        self.state.first_step_time = 0.0 if training else None
        reports: dict = {}
        for number, rank in sorted(self.ready):
            reports.setdefault(number, []).append((rank, RankEvent(EventKind.STANDBY_READY, {"rank": rank})))
        self.ready.clear()
        obs = Observations(now, standby_reports=reports, standby_exits=dict(self.exits), standby_os=dict(self.os))
        t = Tick(None, self.state, obs, Facts(), Decision())
        pools.standby_reports(t)
        claimed = pools.claim_standby(t, claim) if claim is not None else None
        pools.launch_standbys(t)
        for action in t.out.actions:
            if isinstance(action, LaunchStandby):
                self.state.standby.find(action.number).ranks = [SimpleNamespace(rank=r, exited=None) for r in range(2)]
                self.launched.append((action.number, action.slot))
            elif isinstance(action, LoseStandby):
                for rs in action.ranks:
                    rs.exited = rs.exited if rs.exited is not None else -9
        return t.out.actions, claimed


def kinds(actions) -> list[str]:
    from monarch_ft.controller.actions import Emit

    return [a.kind if isinstance(a, Emit) else type(a).__name__ for a in actions]


def test_pool_builds_promotes_and_never_promotes_a_dead_standby():
    w = PoolWorld()
    actions, _ = w.tick(0.0, training=False)
    assert actions == []  # the groups are not up yet
    actions, _ = w.tick(1.0)
    assert kinds(actions) == ["LaunchStandby"] and w.launched == [(0, 2)]
    _, claimed = w.tick(1.5, claim=0)
    assert claimed is None  # building, not ready
    w.ready |= {(0, 0), (0, 1)}
    actions, _ = w.tick(5.0)
    assert kinds(actions) == ["standby_ready"] and w.state.standby.standbys[0].status is StandbyStatus.READY
    # Killed while waiting: lost at the next tick, replaced, never promoted.
    w.exits[(0, 1)] = -9
    actions, claimed = w.tick(6.0, claim=0)
    assert kinds(actions) == ["LoseStandby", "LaunchStandby"] and claimed is None
    lost = actions[0]
    assert (lost.number, lost.was_ready, lost.rebuild) == (0, True, True) and lost.reason == "rank 1 exited (-9)"
    w.ready |= {(1, 0), (1, 1)}
    w.tick(9.0)
    # Stopped (SIGSTOP) when a group fails: found at promotion, lost, not promoted.
    w.os[(1, 0)] = "stopped"
    actions, claimed = w.tick(9.1, claim=1)
    assert claimed is None and kinds(actions) == ["LoseStandby", "LaunchStandby"] and actions[0].reason == "rank 0 is stopped"
    assert w.state.standby.lost == 2
    w.ready |= {(2, 0), (2, 1)}
    w.tick(12.0)
    actions, claimed = w.tick(13.0, claim=2)
    assert claimed is not None and claimed.number == 2 and claimed.status is StandbyStatus.PROMOTED and w.state.standby.promoted == 1
    assert kinds(actions) == ["LaunchStandby"]  # a replacement starts at once
    summary = w.state.standby.summary(14.0)
    assert summary["lost"] == 2 and summary["promoted"] == 1 and summary["seconds_without_ready_standby"] > 0


def test_drill_names_the_recovery_path_of_each_fault():
    """chaos.mttr reads the recovery_path event of the relaunch the fault caused."""
    from chaos.mttr import analyze_fault

    def step(group, attempt, s, t, members):
        return {"group": group, "rank": 0, "attempt": attempt, "step": s, "time": t, "committed": True, "participating_groups": members, "state_hash": f"h{s}"}

    events = [
        {"event": "group_failed", "group": 1, "attempt": 0, "time": 1.1},
        {"event": "recovery_path", "group": 1, "attempt": 1, "path": "standby", "time": 1.15},
        {"event": "group_launched", "group": 1, "attempt": 1, "time": 1.15},
        {"event": "model_ready", "group": 1, "rank": 0, "attempt": 1, "time": 1.3},
        {"event": "weights_recovered", "group": 1, "rank": 0, "attempt": 1, "time": 1.5, "bytes": 10, "seconds": 0.01, "src_group": 0},
    ]
    metrics = [step(0, 0, 9, 0.9, [0, 1]), step(1, 0, 9, 0.9, [0, 1]), step(0, 0, 10, 1.4, [0]), step(0, 0, 11, 2.0, [0, 1]), step(1, 1, 11, 2.0, [0, 1])]
    fault = {"id": 0, "kind": "process_kill", "target": 1, "rank": 0, "at_step": 9, "injected_at": 1.0, "step": 9, "attempt": 0}
    out = analyze_fault(fault, events, metrics, False, 2, 1)
    assert out["recovery_path"] == "standby" and out["recovered"] and out["mttr_s"] == pytest.approx(1.0), out
    assert out["phases"]["replacement_up"] == pytest.approx(0.3)
    # Healed in place (no relaunch): no path.
    collective = analyze_fault({**fault, "kind": "collective"}, events[:1], metrics, False, 2, 1)
    assert collective["recovery_path"] is None


def test_a_controller_that_attached_numbers_its_standbys_after_its_predecessors(tmp_path):
    """A reused number would find the old standby's promotion file (and ready report) and
    take that identity at once: numbers continue after every standby file of the run."""
    from monarch_ft.records.layout import RunLayout

    layout = RunLayout(str(tmp_path))
    assert layout.next_standby_number() == 0  # no ranks/ folder yet
    (tmp_path / "ranks").mkdir()
    for name in ("g0r0.a0.jsonl", "sb0r0.jsonl", "sb2r1.spec.json"):
        (tmp_path / "ranks" / name).write_text("")
    assert layout.next_standby_number() == 3
    w = PoolWorld(first_number=layout.next_standby_number())
    w.tick(1.0)
    assert w.launched == [(3, 2)] and w.state.standby.standbys[0].number == 3  # number 3, on the first standby slot


def test_slurm_place_group_makes_the_promoted_standbys_job_and_node_the_groups(tmp_path):
    """What a later node fault or cancel_group on the group hits (no cluster needed: bookkeeping)."""
    from monarch_ft.launcher.slurm import Options, SlurmLauncher, _Job

    launcher = SlurmLauncher(str(tmp_path), Options(nodes=["n0", "n1", "n2"]))
    standby_job = _Job("42", 2, 0, 0.0)  # a standby is launched as group = its slot
    launcher.current.update({1: _Job("41", 1, 0, 0.0), 2: standby_job})
    assert launcher._group_node(1) == "n1"
    launcher.place_group(1, 2)
    assert launcher.current[1] is standby_job and 2 not in launcher.current
    assert launcher._group_node(1) == "n2"
