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
    StandbyPool,
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


class FakeProc:
    forked = False

    def __init__(self, pid: int) -> None:
        self.pid, self.code, self.signals = pid, None, []

    def poll(self):
        return self.code

    def kill(self):
        self.code = -9

    def send_signal(self, sig):
        self.signals.append(sig)
        self.code = -sig

    def wait(self, timeout):
        return self.code


class FakeRank:
    def __init__(self, pid: int, records: list) -> None:
        self.proc, self.exited, self._records = FakeProc(pid), None, records

    @property
    def tail(self):
        records = self._records

        class Tail:
            def read(self_inner):
                out = list(records)
                records.clear()
                return out

        return Tail()


def make_pool(wanted: int = 1):
    events, launched = [], []

    def emit(kind, **fields):
        events.append((kind, fields))

    def launch(number, slot, now):
        ranks = [FakeRank(100 * number + r, []) for r in range(2)]
        launched.append(ranks)
        return ranks

    return StandbyPool(wanted, 2, emit, launch), events, launched


def ready_all(ranks):
    for r, rank in enumerate(ranks):
        rank._records.append({"type": "event", "event": "standby_ready", "rank": r})


def test_pool_builds_promotes_and_never_promotes_a_dead_standby():
    pool, events, launched = make_pool()
    pool.tick(0.0, training_started=False, job_finishing=False)
    assert not launched  # the groups are not up yet
    pool.tick(1.0, training_started=True, job_finishing=False)
    assert len(launched) == 1 and pool.standbys[0].slot == 2
    assert pool.take(1.5, lambda pid: "sleeping") is None  # building, not ready
    ready_all(launched[0])
    pool.tick(5.0, True, False)
    assert pool.standbys[0].status is StandbyStatus.READY
    # Killed while waiting: lost at the next tick, replaced, never promoted.
    launched[0][1].proc.code = -9
    pool.tick(6.0, True, False)
    assert [k for k, _ in events].count(EventKind.STANDBY_LOST) == 1 and len(launched) == 2
    assert pool.take(6.1, lambda pid: "sleeping") is None
    ready_all(launched[1])
    pool.tick(9.0, True, False)
    # Stopped (SIGSTOP) when a group fails: found at promotion, lost, not promoted.
    assert pool.take(9.1, lambda pid: "stopped" if pid == 101 else "sleeping") is None
    assert pool.lost == 2 and launched[1][0].proc.code == -9
    pool.tick(10.0, True, False)
    ready_all(launched[2])
    pool.tick(12.0, True, False)
    sb = pool.take(13.0, lambda pid: "sleeping")
    assert sb is not None and sb.number == 2 and sb.status is StandbyStatus.PROMOTED and pool.promoted == 1
    pool.tick(13.5, True, False)  # a replacement starts at once
    assert len(launched) == 4
    summary = pool.summary(14.0)
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
    slots = []
    pool = StandbyPool(1, 2, lambda *a, **k: None, lambda number, slot, now: slots.append((number, slot)) or [FakeRank(1, [])], first_number=3)
    pool.tick(1.0, training_started=True, job_finishing=False)
    assert slots == [(3, 2)] and pool.standbys[0].number == 3  # number 3, on the first standby slot


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
