"""The pure parts of detach/attach (monarch_ft.controller.takeover, the lease: records.lease and
rank.components.lease): fast, no jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from monarch_ft.common.process import ProcessIdentity, is_same_process
from monarch_ft.controller.takeover import AttachAction, RunLock, controller_attached, decide_attach
from monarch_ft.rank.components.lease import ControllerLease
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import GroupStatus
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.lease import FINISH_LEAD_MAX, FINISH_MARGIN, controller_finish_margin, finish_at, lease_expired, lower_finish, stop_unanswered


def test_identity_is_pid_and_start_time():
    me = ProcessIdentity.of(os.getpid())
    assert me is not None and me.start is not None and me.alive()
    # The same pid with another start time is another process (a reused pid).
    assert not ProcessIdentity(os.getpid(), str(int(me.start) + 1)).alive()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = ProcessIdentity.of(child.pid)
    child.wait()
    assert ident is not None and not ident.alive()
    assert not is_same_process(None, "123") and not is_same_process("123", None) and is_same_process("123", "123")


@pytest.mark.parametrize(
    "status, alive, exited, action",
    [
        (GroupStatus.RUNNING, [True, True], [None, None], AttachAction.ADOPT),
        (GroupStatus.STARTING, [True, True], [None, None], AttachAction.ADOPT),
        (GroupStatus.RUNNING, [True, False], [None, None], AttachAction.FAIL),  # killed while unsupervised
        (GroupStatus.RUNNING, [True, False], [None, 0], AttachAction.ADOPT),  # one rank already finished cleanly
        (GroupStatus.RUNNING, [False, False], [None, 1], AttachAction.FAIL),
        (GroupStatus.WAITING, [False], [-9], AttachAction.KEEP),  # its relaunch was due: the new controller launches it
        (GroupStatus.DONE, [False, False], [0, 0], AttachAction.KEEP),
        (GroupStatus.GIVEN_UP, [], [], AttachAction.KEEP),
    ],
)
def test_attach_decisions(status, alive, exited, action):
    assert decide_attach(status, alive, exited) is action


def test_lease():
    assert not lease_expired(None, 100.0, 5.0)  # no heartbeat yet: not expired
    assert not lease_expired(96.0, 100.0, 5.0)
    assert lease_expired(94.0, 100.0, 5.0)
    # A stop is the ranks' to carry out only when no controller answers it.
    assert not stop_unanswered(True, 99.5, 100.0, 1.0)
    assert stop_unanswered(True, 96.0, 100.0, 1.0)
    assert not stop_unanswered(False, 0.0, 100.0, 1.0)


def test_lease_reads_the_heartbeat_and_the_stop(tmp_path):
    layout = RunLayout(str(tmp_path))
    os.makedirs(layout.control_dir)
    lease = ControllerLease(layout.controller_heartbeat, layout.stop_request, lease_s=5.0, heartbeat_s=1.0, check_every_s=0.0)
    assert lease.ended() is None
    open(layout.controller_heartbeat, "w").close()
    assert lease.ended() is None
    old = time.time() - 10
    os.utime(layout.controller_heartbeat, (old, old))
    assert lease.ended() == "lease_expired"
    stop = ControllerLease(layout.controller_heartbeat, layout.stop_request, lease_s=60.0, heartbeat_s=1.0, check_every_s=0.0)
    assert stop.ended() is None
    open(layout.stop_request, "w").close()
    assert stop.ended() == "stop_requested"


def test_finish_at_first_writer_wins(tmp_path):
    path = str(tmp_path / "stop_at_step")
    assert finish_at(path, 10) == 12
    assert finish_at(path, 11) == 12  # a later rank reads the step in force
    assert open(path).read() == "12"
    assert sorted(os.listdir(tmp_path)) == ["stop_at_step"]


def test_a_controller_s_stop_asks_a_second_of_steps_ahead_of_its_lagging_view():
    assert controller_finish_margin(None) == FINISH_MARGIN  # no pace learned yet
    assert controller_finish_margin(0.05) == FINISH_MARGIN + 20  # 20 steps a second
    assert controller_finish_margin(3.0) == FINISH_MARGIN + 1  # slow steps: the next one
    assert controller_finish_margin(1e-7) == FINISH_MARGIN + FINISH_LEAD_MAX


def test_a_stop_lowers_a_finish_step_already_asked_for_and_every_rank_reads_the_lowest(tmp_path):
    from monarch_ft.rank.trainer import StopAt

    path = str(tmp_path / "stop_at_step")
    rank = StopAt(path, 1000)
    assert rank.steps() == 1000
    assert lower_finish(path, 500) == 500  # a drill asks for a late finish
    assert rank.steps() == 500
    assert lower_finish(path, 40) == 40  # then a stop: it finishes now, not at 500
    late = StopAt(path, 1000)  # a rank that never saw 500
    assert rank.steps() == 40 and late.steps() == 40
    assert lower_finish(path, 60) == 40  # never raised
    assert finish_at(path, 100) == 40  # nor by a rank's lease
    assert rank.steps() == late.steps() == 40


def test_run_lock_refuses_a_second_controller(tmp_path):
    layout = RunLayout(str(tmp_path))
    assert controller_attached(layout) is None
    first = RunLock(layout.controller_lock)
    first.acquire()
    assert controller_attached(layout) == os.getpid()
    with pytest.raises(ConfigError, match=f"another controller \\(pid {os.getpid()}\\) is supervising"):
        RunLock(layout.controller_lock).acquire()
    first.release()
    assert controller_attached(layout) is None
    second = RunLock(layout.controller_lock)
    second.acquire()
    second.release()


def test_drill_injector_state_survives_its_controller(tmp_path):
    """A controller fault kills the process the injector runs in: the next controller's
    injector continues from the saved state (the same fault in progress, the same draws)."""
    from chaos.config import FaultConfig
    from chaos.injector import ChaosInjector
    from chaos.outcome import NotInjected

    faults = [FaultConfig(kind="controller", at_step=5), FaultConfig(kind="process_kill", at_step=9)]
    path = str(tmp_path / "chaos_injector.json")
    first = ChaosInjector(faults, seed=3, allow_last_healthy=False, recovery_timeout_s=60, state_path=path)
    first.rng.random()
    first.actives = [{"id": 0, "kind": "controller", "target": 1, "injected_at": 12.5, "attempt": 0, "step": 5, "members": [0, 1]}]
    first.injected.append(first.actives[0])
    first.next_index = 1
    first._hold(None, NotInjected.PREVIOUS_NOT_RECOVERED, previous=0)  # why fault 1 waits
    first._save()
    second = ChaosInjector(faults, seed=3, allow_last_healthy=False, recovery_timeout_s=60, state_path=path)
    second.restore()
    assert second.started == first.started and second.next_index == 1
    assert second.actives == first.actives and second.actives[0] is second.injected[-1]
    assert second.rng.random() == first.rng.random()
    assert second.blocked == {1: {"reason": NotInjected.PREVIOUS_NOT_RECOVERED.value, "previous": 0}}, second.blocked


def test_mttr_of_control_plane_faults():
    """A Lighthouse fault is detected when the supervisor sees it die and repaired at the
    first commit with every group after the restart; a controller fault at the attach."""
    from chaos.mttr import analyze_fault

    t0 = 1000.0

    def commit(group, step, t):
        return {"group": group, "rank": 0, "attempt": 0, "step": step, "committed": True, "time": t, "participating_groups": [0, 1]}

    metrics = [commit(g, s, t0 - 1 + 0.1 * s) for g in (0, 1) for s in range(5)] + [commit(g, 5, t0 + 10.0) for g in (0, 1)]
    fault = {"id": 0, "kind": "lighthouse", "target": 1, "rank": 0, "at_step": 3, "injected_at": t0, "step": 4, "attempt": 0}
    events = [{"event": "lighthouse_lost", "time": t0 + 0.1}, {"event": "lighthouse_restarted", "time": t0 + 0.6}]
    out = analyze_fault(fault, events, metrics, False, 2, 1)
    assert out["phases"]["detected"] == 0.1 and out["mttr_s"] == 10.0 and out["recovered"], out
    assert out["phases"]["replacement_up"] is None and out["job_steps_lost"] == 0
    fault = {**fault, "kind": "controller"}
    events = [{"event": "controller_lost", "time": t0 - 0.5}, {"event": "controller_attached", "time": t0 + 7.0}]
    out = analyze_fault(fault, events, metrics, False, 2, 1)
    assert out["mttr_s"] == 7.0 and out["phases"]["back_in_quorum"] == 10.0 and out["recovered"], out
    # Not attached yet: not recovered, whatever the ranks commit meanwhile.
    out = analyze_fault(fault, events[:1], metrics, False, 2, 1)
    assert not out["recovered"] and out["mttr_s"] is None


def test_a_zombie_is_not_alive():
    """An orphaned rank killed while unsupervised may stay a zombie until init reaps it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = ProcessIdentity.of(child.pid)
    deadline = time.time() + 10
    while time.time() < deadline and open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.05)
    assert ident is not None and not ident.alive()  # not reaped yet: a zombie
    child.wait()


def test_records_relayed_before_a_kill_are_taken_in_and_relayed_once(tmp_path):
    """A controller killed between relaying records and saving its report offsets (a tick
    that only took records in saves up to PROGRESS_SAVE_MAX_S later): the next one reads from
    the saved offset and marks what it finds already relayed, to take in but not relay."""
    import json

    from monarch_ft.controller.takeover import ResumedTail, relayed_records
    from monarch_ft.records.report_records import RankEvent, StepRecord

    report, metrics = tmp_path / "g0r0.a0.jsonl", tmp_path / "metrics.jsonl"
    recs = [{"type": "step", "group": 0, "rank": 0, "pid": 7, "step": s, "committed": True, "time": 100.0 + s} for s in range(4)]
    recs.insert(2, {"type": "event", "event": "checkpoint_saved", "group": 0, "rank": 0, "pid": 7, "time": 101.5})
    report.write_text("".join(json.dumps(r) + "\n" for r in recs))
    saved = len(json.dumps(recs[0])) + 1  # the last saved offset: after the first record
    # Relayed after that save (then the kill): steps 1 (metrics.jsonl) and the event (events.jsonl).
    metrics.write_text(json.dumps(recs[0]) + "\n" + json.dumps(recs[1]) + "\n")
    events = [{"time": 101.5, "event": "checkpoint_saved", "group": 0, "rank": 0, "pid": 7}, {"time": 99.0, "event": "job_started"}]
    # Read as the tick's observe stage reads a report (read_records: typed, each step with its line, relayed as written).
    tail = ResumedTail(str(report), relayed_records(events, str(metrics)))
    tail.seek(saved)
    kept = tail.read_records()
    assert [type(r) for r in kept] == [StepRecord, RankEvent, StepRecord, StepRecord]
    assert [r.relayed for r in kept] == [True, True, False, False], "the relayed step and event are marked, the rest not"
    assert [r.step for r in kept if isinstance(r, StepRecord)] == [1, 2, 3]
    assert [json.loads(r.line) for r in kept if isinstance(r, StepRecord)] == [recs[1], recs[3], recs[4]]
    with open(report, "a") as f:  # later records are never marked, whatever their time
        f.write(json.dumps({**recs[1], "time": 101.0}) + "\n")
    assert [(r.step, r.relayed) for r in tail.read_records()] == [(1, False)]


def test_a_tick_that_only_took_records_in_saves_at_a_quiet_tick_within_its_bounds():
    from monarch_ft.controller.takeover import PROGRESS_SAVE_MAX_S, PROGRESS_SAVE_S, progress_save_due

    assert PROGRESS_SAVE_S < PROGRESS_SAVE_MAX_S
    assert not progress_save_due(PROGRESS_SAVE_S - 0.01, quiet=True)
    assert not progress_save_due(PROGRESS_SAVE_S, quiet=False)  # the tick read steps: a later one
    assert progress_save_due(PROGRESS_SAVE_S, quiet=True)
    assert progress_save_due(PROGRESS_SAVE_MAX_S, quiet=False)  # steps every tick: saved all the same


def test_a_look_that_read_heartbeats_only_is_quiet():
    """Ranks write heartbeats and liveness between their steps: a tick that read only those is
    still one between two steps, where a deferred save goes."""
    from monarch_ft.controller.observe import Observations
    from monarch_ft.records.report_records import Heartbeat, Liveness, StepRecord

    beats = [(0, Heartbeat({"type": "heartbeat", "group": 0, "rank": 0})), (0, Liveness({"type": "liveness", "group": 0, "rank": 0, "phase": "step"}))]
    assert not Observations(0.0).read_steps() and not Observations(0.0, reports={0: beats, 1: []}).read_steps()
    step = (0, StepRecord({"type": "step", "group": 1, "rank": 0, "step": 3, "committed": True}))
    assert Observations(0.0, reports={0: beats, 1: [step]}).read_steps()
