"""Pure recovery decisions and the rank-side guards, on plain values and real files (fast)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from monarch_ft.rank.components.checkpoint import SaveWatchdog, save_due
from monarch_ft.rank.components.ft import CommitFloor
from monarch_ft.records.exits import RankExit, describe_exit
from monarch_ft.controller.hangs import (
    BlameReason,
    Hang,
    HangLimits,
    RankView,
    StepTimeLearner,
    asleep_compute_timeout,
    auto_hang_timeout,
    find_hang,
    is_job_stall,
    percentile,
    track_cpu,
    track_os_state,
)
from monarch_ft.config.ft import hang_timeout_setting
from monarch_ft.controller.ledger import CommitLedger
from monarch_ft.records.decisions import JobStateLost, StateSource, decide_state_source
from monarch_ft.records.phases import Phase
from monarch_ft.records.layout import RunLayout, atomic_write, read_json

LIMITS = HangLimits(hang_timeout_s=6, startup_timeout_s=120, save_timeout_s=30, sync_budget_s=36)


# ---------------------------------------------------------------- where a group's state comes from
def test_a_live_peer_heals_the_group():
    assert decide_state_source([1], job_step=2510, checkpoint_step=2500).source is StateSource.PEER


def test_no_live_peer_loads_the_newest_checkpoint_and_counts_what_is_lost():
    d = decide_state_source([], job_step=2510, checkpoint_step=2500)
    assert (d.source, d.step, d.steps_lost) == (StateSource.DISK, 2500, 10)


def test_initial_weights_only_while_nothing_was_committed():
    assert decide_state_source([], job_step=0, checkpoint_step=None).source is StateSource.INIT


def test_no_peer_and_no_checkpoint_stops_the_job_instead_of_starting_over():
    with pytest.raises(JobStateLost, match="checkpoint.enable=true"):
        decide_state_source([], job_step=200, checkpoint_step=None)


def test_a_checkpoint_ahead_of_the_job_is_not_its_state():
    with pytest.raises(ValueError, match="not this job's"):
        decide_state_source([], job_step=20, checkpoint_step=50)


# ---------------------------------------------------------------- the job's committed step
def test_ledger_takes_a_slow_groups_late_commit():
    # Seen in a soak: groups 0 and 2 commit 366 in quorum 7; group 0 goes on alone in
    # quorum 8 and commits 367 before group 2 writes its (legitimate) commit of 366.
    ledger = CommitLedger()
    assert ledger.record(366, quorum_id=7) is None
    assert ledger.record(367, quorum_id=8) is None
    assert ledger.record(366, quorum_id=7) is None
    assert ledger.record(368, quorum_id=9) is None and ledger.job_step == 369


def test_ledger_names_a_commit_below_what_an_earlier_quorum_committed():
    ledger = CommitLedger()
    for step in range(2500, 2510):
        ledger.record(step, quorum_id=40)
    assert ledger.record(0, quorum_id=41) == 2509  # a group alone with its initial weights
    ledger.rollback(2500)  # an explicit rollback to a checkpoint resets what counts
    assert ledger.job_step == 2500 and ledger.record(2500, quorum_id=42) is None


def test_commit_floor_refuses_below_the_job_step(tmp_path):
    floor = CommitFloor(str(tmp_path / "commit_floor"))
    assert floor.allows(0) == (True, 0)  # no file yet: nothing committed
    atomic_write(floor.path, "2510")
    assert floor.allows(2509) == (True, 2510)  # the newest step again (a quorum peer)
    assert floor.allows(2510) == (True, 2510)
    assert floor.allows(0) == (False, 2510) and floor.refusals == 1
    assert floor.allows(0) == (False, 2510) and floor.refusals == 2
    assert floor.allows(2510) == (True, 2510) and floor.refusals == 0  # healed: the count starts over


def test_deliberate_exits_are_named():
    assert describe_exit(int(RankExit.COMMIT_BELOW_FLOOR))["exit_reason"] == "commit_below_floor"
    assert describe_exit(int(RankExit.SAVE_TIMEOUT))["exit_reason"] == "save_timeout"
    assert "exit_reason" not in describe_exit(1) and describe_exit(-9)["signal"] == "SIGKILL"


# ---------------------------------------------------------------- hangs
def _view(rank, silent=0.5, phase=Phase.COMPUTE, phase_s=0.5, os_state="sleeping", started=True):
    return RankView(rank=rank, silent_s=silent, started=started, phase=phase.value, phase_s=phase_s, os_state=os_state)


def test_a_long_save_or_a_wait_in_torchft_is_not_a_hang():
    assert find_hang([_view(0, phase=Phase.SAVE, phase_s=20)], LIMITS) is None
    assert find_hang([_view(0, phase=Phase.SYNC, phase_s=30)], LIMITS) is None
    assert find_hang([_view(0, phase=Phase.GATE, phase_s=500)], LIMITS) is None


def test_stuck_past_the_phase_budget_or_silent_is_a_hang():
    assert find_hang([_view(0, phase=Phase.SAVE, phase_s=34)], LIMITS).rank == 0
    assert find_hang([_view(0, phase=Phase.COMPUTE, phase_s=7)], LIMITS).phase == "compute"
    assert find_hang([_view(0, silent=7, phase=Phase.SYNC, phase_s=7)], LIMITS).silent_s == 7


def test_startup_gets_its_own_limit():
    assert find_hang([_view(0, silent=60, phase=Phase.STARTUP, phase_s=60, started=False)], LIMITS) is None
    assert find_hang([_view(0, silent=121, started=False)], LIMITS) is not None


def test_the_stopped_rank_is_blamed_not_its_waiting_peer():
    ranks = [_view(0, silent=7, phase=Phase.SYNC, phase_s=9), _view(1, silent=6.5, os_state="stopped")]
    hang = find_hang(ranks, LIMITS)
    assert hang.rank == 1 and hang.self_explained


def test_the_rank_stuck_computing_is_blamed_not_the_one_waiting_for_it():
    # Rank 1 sleeps before the allreduce (its liveness thread still beats); rank 0 waits in sync.
    ranks = [_view(0, phase=Phase.SYNC, phase_s=9), _view(1, phase=Phase.COMPUTE, phase_s=8)]
    assert find_hang(ranks, LIMITS).rank == 1


def _hang(rank=0, explained=False):
    return Hang(rank=rank, silent_s=7, os_state="stopped" if explained else "sleeping", self_explained=explained, phase="compute", phase_s=7)


def test_every_stepping_group_hung_is_one_job_stall():
    assert is_job_stall({1: _hang(), 2: _hang()}, stepping=[1, 2])
    assert is_job_stall({0: _hang()}, stepping=[0])  # the last group holding the job's state
    assert not is_job_stall({1: _hang()}, stepping=[1, 2])  # group 2 still steps
    assert not is_job_stall({1: _hang(explained=True), 2: _hang()}, stepping=[1, 2])  # a real fault
    assert not is_job_stall({}, stepping=[1, 2])


# ---------------------------------------------------------------- saves
def test_save_watchdog_reports_and_ends_a_stuck_save(tmp_path):
    reports, exits = [], []
    dog = SaveWatchdog(0.2, lambda name, **kw: reports.append((name, kw)), str(tmp_path / "stacks" / "save.txt"), on_timeout=exits.append)
    with dog.guard(step=10):
        pass
    assert [n for n, _ in reports] == ["checkpoint_save_started", "checkpoint_saved"] and not exits
    reports.clear()
    import time

    with dog.guard(step=20):
        time.sleep(0.6)
    assert exits == [int(RankExit.SAVE_TIMEOUT)]
    names = [n for n, _ in reports]
    assert names[:2] == ["checkpoint_save_started", "checkpoint_save_timeout"]
    timeout = dict(reports)["checkpoint_save_timeout"]
    assert timeout["step"] == 20 and "test_save_watchdog" in open(timeout["stacks"]).read()


def test_save_due_follows_torchtitan():
    assert save_due(10, 10, False) and not save_due(11, 10, False) and save_due(11, 10, True)


# ---------------------------------------------------------------- the run directory
def test_run_layout_spells_each_path_once(tmp_path):
    layout = RunLayout(str(tmp_path), "ckpt")
    assert layout.report(1, 0, 3).endswith("ranks/g1r0.a3.jsonl")
    assert layout.checkpoint(2) == os.path.join(str(tmp_path), "ckpt", "group_2")
    assert layout.start_gate(0).endswith("control/start") and layout.start_gate(2).endswith("control/start.2")
    assert layout.launch_gate(1, 4).endswith("control/launch.g1.a4")
    os.makedirs(layout.control_dir)
    atomic_write(layout.launch_gate(1, 4), json.dumps({"source": "disk", "step": 20}))
    assert read_json(layout.launch_gate(1, 4)) == {"source": "disk", "step": 20}
    open(layout.start_gate(0), "w").close()
    assert read_json(layout.start_gate(0), {}) == {} and read_json(layout.hold) is None
    assert not [p for p in os.listdir(layout.control_dir) if ".tmp" in p]


def test_drill_check_reads_quorums_not_record_times():
    from chaos.mttr import steps_never_go_back

    def commit(group, attempt, step, quorum, t):
        return {"group": group, "rank": 0, "attempt": attempt, "step": step, "quorum_id": quorum, "time": t, "committed": True}

    late = [commit(0, 1, 366, 7, 1.44), commit(0, 1, 367, 8, 3.69), commit(2, 0, 366, 7, 3.76), commit(2, 0, 368, 9, 4.97)]
    assert steps_never_go_back(late)
    assert not steps_never_go_back([commit(0, 0, 2509, 40, 1.0), commit(1, 1, 0, 41, 2.0)])
    assert not steps_never_go_back([commit(0, 0, 12, 3, 1.0), commit(0, 0, 12, 3, 2.0)])  # one attempt twice


# ---------------------------------------------------------------- hangs in about a second
def _stall_view(rank, state, held, phase=Phase.COMPUTE, silent=0.2):
    return RankView(rank=rank, silent_s=silent, started=True, phase=phase.value, phase_s=0.3, os_state=state, os_state_s=held)


def test_a_state_held_without_a_break_is_an_os_stall_at_once():
    # SIGSTOP: 0.5 s stopped is hung long before any timeout (6 s here); the peer is not blamed.
    hang = find_hang([_stall_view(0, "sleeping", 5.0), _stall_view(1, "stopped", 0.6)], LIMITS)
    assert hang.rank == 1 and hang.reason == BlameReason.OS_STALL and hang.self_explained
    assert hang.rank_states == {0: "sleeping", 1: "stopped"}  # carried, not sampled again
    assert find_hang([_stall_view(1, "stopped", 0.3)], LIMITS) is None  # not yet held long enough
    assert find_hang([_stall_view(1, "zombie", 0.6)], LIMITS).reason == BlameReason.OS_STALL
    finishing = dataclasses.replace(_stall_view(1, "zombie", 0.6), finished=True)  # exiting after train_done
    assert find_hang([finishing], LIMITS) is None


def test_disk_sleep_counts_only_held_and_outside_io_phases():
    assert find_hang([_stall_view(0, "disk-sleep", 0.1)], LIMITS) is None  # one write: one sample
    assert find_hang([_stall_view(0, "disk-sleep", 0.6)], LIMITS).reason == BlameReason.OS_STALL
    assert find_hang([_stall_view(0, "disk-sleep", 5.0, phase=Phase.SAVE)], LIMITS) is None  # the save's budget
    assert find_hang([_stall_view(0, "disk-sleep", 5.0, phase=Phase.STARTUP)], LIMITS) is None  # cold imports
    assert find_hang([_stall_view(0, "tracing-stop", 5.0)], LIMITS) is None  # py-spy's own ptrace stop


def test_os_state_track_needs_every_sample_in_between():
    s = track_os_state(None, "disk-sleep", 10.0, max_gap_s=0.5)
    s = track_os_state(s, "disk-sleep", 10.3, max_gap_s=0.5)
    assert s.held_s == pytest.approx(0.3)
    assert track_os_state(s, "sleeping", 10.35, 0.5).held_s == 0  # left it: starts over
    assert track_os_state(s, "disk-sleep", 11.5, 0.5).held_s == 0  # not watched in between: unknown


def test_a_rank_sleeping_with_the_gil_is_blamed_not_its_peers_or_their_state():
    # The gil rank's OS state ("sleeping") is its peers'; only its silence tells. The peer
    # went past its compute budget first (it entered compute before the gil rank froze).
    peer = RankView(rank=0, silent_s=0.1, started=True, phase="compute", phase_s=6.2, os_state="sleeping", os_state_s=6)
    gil = RankView(rank=1, silent_s=5.8, started=True, phase="compute", phase_s=6.1, os_state="sleeping", os_state_s=6)
    hang = find_hang([peer, gil], LIMITS)
    assert hang.rank == 1 and hang.reason == BlameReason.SILENT and not hang.self_explained
    # A survivor of another group waiting in TorchFT for the hung group is not hung at all.
    survivor = RankView(rank=0, silent_s=0.1, started=True, phase="sync", phase_s=20, os_state="sleeping", os_state_s=20)
    assert find_hang([survivor, dataclasses.replace(survivor, rank=1)], LIMITS) is None


def test_auto_hang_timeout_learns_k_times_p99_above_the_floor():
    assert hang_timeout_setting("auto") is None and hang_timeout_setting("20") == 20.0 and hang_timeout_setting(6) == 6.0
    with pytest.raises(ValueError, match="auto or a number"):
        hang_timeout_setting("soon")
    assert auto_hang_timeout([0.1] * 50, min_s=3.0, factor=10, fallback_s=15) == 3.0  # the floor
    assert auto_hang_timeout([0.5] * 99 + [0.9], min_s=3.0, factor=10, fallback_s=15) == pytest.approx(10 * percentile([0.5] * 99 + [0.9], 99))
    assert auto_hang_timeout([0.1], min_s=3.0, factor=10, fallback_s=15) == 15  # too few steps seen


def test_step_time_learner_skips_first_steps_and_sync_waits():
    learn = StepTimeLearner(window=3)
    rec = {"group": 0, "rank": 0, "attempt": 0}
    learn.observe({**rec, "step_time_s": 9.0})  # the attempt's first step: lazy init, first quorum
    assert not learn.samples
    learn.observe({**rec, "step_time_s": 1.3, "quorum_s": 1.0, "xgroup_s": 0.1})  # a survivor's wait for the Lighthouse
    assert learn.samples[-1] == pytest.approx(0.2)
    for t in (0.3, 0.4, 0.5):
        learn.observe({**rec, "step_time_s": t})
    assert list(learn.samples) == [0.3, 0.4, 0.5]  # the window keeps the recent ones


def test_restart_backoff_doubles_to_its_cap_then_the_budget_gives_up():
    from monarch_ft.controller.budget import restart_backoff

    assert [restart_backoff(n, 5, 0.5, 3.0) for n in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, None]
    assert restart_backoff(0, 0, 0.5, 8.0) is None, "ft.max_restarts=0: a failed group is never relaunched"


def test_start_gate_waits_for_every_group_or_half_the_startup_timeout():
    from monarch_ft.controller.gates import start_gate_opens

    assert start_gate_opens(True, 0.0, 120.0)
    assert not start_gate_opens(False, 59.0, 120.0)
    assert start_gate_opens(False, 61.0, 120.0), "a group that cannot start does not hold the others"


def test_a_step_committed_again_by_a_later_quorum_with_other_weights_was_redone():
    from monarch_ft.controller.ledger import redone_commit

    seen: dict = {}
    assert redone_commit(seen, 3, 0, "aaa") is None  # group 0 commits step s alone in quorum 3, then dies
    assert redone_commit(seen, 3, 1, "aaa") is None  # a peer of the same quorum: same weights
    assert redone_commit(seen, 4, 1, "bbb") == {"quorum_id": 3, "group": 0}  # redone from the step before
    same: dict = {}
    redone_commit(same, 3, 0, "aaa")
    assert redone_commit(same, 4, 1, "aaa") is None  # a record naming the next quorum, same weights: not redone


def test_a_redone_step_is_told_whichever_commit_is_read_first():
    from monarch_ft.controller.ledger import redone_commit

    seen: dict = {}
    assert redone_commit(seen, 4, 1, "bbb") is None  # the later quorum's report read first
    assert redone_commit(seen, 3, 0, "aaa") == {"quorum_id": 4, "group": 1}  # the caller orders them by quorum id


# ---------------------------------------------------------------- asleep: hung in about a second
ASLEEP = dataclasses.replace(LIMITS, asleep_s=1.0, asleep_compute_s=1.0)


def _rank(rank, phase=Phase.COMPUTE, phase_s=1.5, silent=0.1, asleep=1.5, state="sleeping", held=1.5, started=True):
    return RankView(rank, silent, started, phase.value, phase_s, state, held, asleep_s=asleep)


def test_cpu_track_keeps_an_asleep_spell_until_the_process_works():
    s = track_cpu(None, 10.0, now=100.0)
    s = track_cpu(s, 10.02, now=100.5)  # a beat or two: still asleep
    s = track_cpu(s, 10.05, now=101.2)
    assert s.asleep_s == pytest.approx(1.2)
    woke = track_cpu(s, 10.3, now=101.3)  # a quarter of a CPU second: it computes
    assert woke.asleep_s == 0 and woke.cpu_s == 10.3
    assert track_cpu(s, None, 101.3) is None  # not readable (no local pid): unknown, never asleep
    # A counter: a supervisor that did not sample for a while still knows what was used.
    assert track_cpu(track_cpu(None, 5.0, 0.0), 5.1, 3.0).asleep_s == 3.0


def test_a_rank_holding_the_gil_is_hung_in_about_a_second_not_its_waiting_peer():
    # The gil rank: silent, asleep, its main thread sleeping. Its peer waits for it in a
    # collective of the group (compute, asleep too, since before) but its liveness thread beats.
    peer = _rank(0, phase_s=1.6, asleep=1.1)
    gil = _rank(1, phase_s=1.4, silent=1.1, asleep=1.1, held=1.1)
    hang = find_hang([peer, gil], ASLEEP, others_beating=True)
    assert hang.rank == 1 and hang.reason == BlameReason.FROZEN and hang.self_explained and hang.asleep_s == 1.1
    # Not before ft.asleep_s, and then only by the old silence rule (hang timeout 6 s here).
    assert find_hang([peer, _rank(1, silent=0.9, asleep=0.9, held=0.9)], ASLEEP, others_beating=True) is None
    assert find_hang([peer, gil], LIMITS, others_beating=True) is None  # the rules off: 6 s of silence
    # Frozen in a checkpoint save (the signal came while it saved): the same.
    in_save = dataclasses.replace(gil, phase=Phase.SAVE.value)
    assert find_hang([peer, in_save], ASLEEP, others_beating=True).reason == BlameReason.FROZEN


def test_a_silent_rank_that_still_works_or_waits_for_cpu_is_not_frozen():
    others = dict(others_beating=True)
    # Busy on a loaded machine: misses beats for 1.5 s, but its process uses CPU.
    assert find_hang([_rank(0, silent=1.5, asleep=0.2)], ASLEEP, **others) is None
    # Starved: runnable, not sleeping (it got next to no CPU for a while).
    assert find_hang([_rank(0, silent=1.5, state="running", held=1.5)], ASLEEP, **others) is None
    # Sleeping at every sample but seen so only for a moment (a sample missed, py-spy's stop).
    assert find_hang([_rank(0, silent=1.5, held=0.4)], ASLEEP, **others) is None
    # Nobody beats anywhere: a shared cause (the filesystem, the machine), not this rank.
    assert find_hang([_rank(0, silent=1.5), _rank(1, silent=1.4)], ASLEEP, others_beating=False) is None
    # A save that writes: CPU, or disk-sleep (not sleeping); startup, a group not stepping yet,
    # a rank on its way out.
    assert find_hang([_rank(0, phase=Phase.SAVE, silent=1.5, asleep=0.3)], ASLEEP, **others) is None
    assert find_hang([_rank(0, phase=Phase.SAVE, silent=1.5, state="disk-sleep", held=0.4)], ASLEEP, **others) is None
    assert find_hang([_rank(0, phase=Phase.STARTUP, silent=1.5, started=False)], ASLEEP, **others) is None
    assert find_hang([_rank(0, silent=1.5, started=False)], ASLEEP, **others) is None
    assert find_hang([dataclasses.replace(_rank(0, silent=1.5), finished=True)], ASLEEP, **others) is None


def test_the_rank_asleep_in_compute_its_group_waits_for_is_hung_in_about_a_second():
    # collective hang: rank 1 sleeps before its allreduce (it still beats); rank 0 did its
    # allreduce and waits in the commit vote for it, since after rank 1 entered compute.
    waiting = _rank(0, phase=Phase.SYNC, phase_s=0.9, asleep=1.2)
    stuck = _rank(1, phase=Phase.COMPUTE, phase_s=1.3, asleep=1.2)
    hang = find_hang([waiting, stuck], ASLEEP)
    assert hang.rank == 1 and hang.reason == BlameReason.ASLEEP
    assert find_hang([stuck], ASLEEP).reason == BlameReason.ASLEEP  # a group of one rank
    assert find_hang([waiting, _rank(1, phase_s=0.9, asleep=0.9, held=0.9)], ASLEEP) is None  # not yet


def test_a_group_waiting_for_another_group_or_for_a_slow_peer_is_not_asleep_in_compute():
    # Survivors waiting in TorchFT for a hung group (allreduce, quorum): asleep, in sync.
    survivors = [_rank(0, phase=Phase.SYNC, phase_s=2.5, asleep=2.5), _rank(1, phase=Phase.SYNC, phase_s=2.4, asleep=2.4)]
    assert find_hang(survivors, ASLEEP, others_beating=True) is None
    # A group healing from a hung peer: rank 1 still receives (sync, since the quorum), rank 0
    # healed first and waits in compute for rank 1 in its first collective.
    healing = [_rank(0, phase=Phase.COMPUTE, phase_s=1.5, asleep=1.5), _rank(1, phase=Phase.SYNC, phase_s=1.7, asleep=1.7)]
    assert find_hang(healing, ASLEEP, others_beating=True) is None
    # A slow peer on a loaded machine: rank 0 waits for it in compute, but rank 1 computes.
    slow = [_rank(0, phase_s=1.6, asleep=1.5), _rank(1, phase_s=1.5, asleep=0.1, state="running", held=0.2)]
    assert find_hang(slow, ASLEEP, others_beating=True) is None
    # Long steps on a GPU (the host thread may block while the device computes): within a few
    # learned compute times, not judged. On a CPU computing is CPU work: ft.asleep_s, however
    # long the learned steps (a loaded machine, or the hung step itself learned).
    long_steps = dataclasses.replace(ASLEEP, asleep_compute_s=asleep_compute_timeout(2.0, 1.0, on_cpu=False))
    assert long_steps.asleep_compute_s == 8.0 and asleep_compute_timeout(0.1, 1.0, on_cpu=False) == 1.0
    assert asleep_compute_timeout(None, 1.0, on_cpu=False) == 1.0 and asleep_compute_timeout(8.0, 1.0, on_cpu=True) == 1.0
    assert find_hang([_rank(0, phase_s=3.0, asleep=3.0, held=3.0)], long_steps) is None
    # A member missing beats: not this rule's; frozen decides once it is silent for ft.asleep_s.
    group = [_rank(0, phase_s=1.6), _rank(1, phase=Phase.SYNC, phase_s=1.2, silent=0.8)]
    assert find_hang(group, ASLEEP) is None
    assert find_hang([group[0], dataclasses.replace(group[1], silent_s=1.0)], ASLEEP).reason == BlameReason.FROZEN


def test_a_frozen_rank_is_a_fault_of_its_own_every_group_asleep_in_compute_is_one_stall():
    hang = find_hang([_rank(0, silent=1.2, asleep=1.2, held=1.2)], ASLEEP, others_beating=True)
    assert hang.reason == BlameReason.FROZEN and hang.self_explained
    assert not is_job_stall({0: hang, 1: _hang()}, stepping=[0, 1])
    # The job's only group asleep in compute (the last one holding its state): waited out as a
    # stall, never killed by the detector; with another group stepping, that group alone fails.
    asleep = find_hang([_rank(0)], ASLEEP)
    assert asleep.reason == BlameReason.ASLEEP and not asleep.self_explained
    assert is_job_stall({0: asleep}, stepping=[0]) and not is_job_stall({0: asleep}, stepping=[0, 1])


def test_the_restart_budget_is_a_rate_five_faults_hours_apart_pass_three_in_a_second_spend_it():
    from monarch_ft.controller.budget import recent_restarts, restart_backoff

    hour = 3600.0

    def decide(restarts: list[float], now: float) -> float | None:
        # ft.max_restarts=3 within ft.restart_window_s=3600, backoff 0.5 s doubling to 8 s.
        return restart_backoff(recent_restarts(restarts, now, hour), 3, 0.5, 8.0)

    # Five faults two hours apart (a multi-day job's ordinary faults): each is relaunched, and
    # after the base backoff: the window holds none of the earlier relaunches. A lifetime
    # budget of 3 would have given up at the fourth.
    restarts: list[float] = []
    for fault in (0.0, 2 * hour, 4 * hour, 6 * hour, 8 * hour):
        assert decide(restarts, fault) == 0.5
        restarts.append(fault)
    assert len(restarts) == 5
    # Three failures within a second are relaunched (backoff doubling with the recent ones);
    # they spend the budget: the fourth failure in the window gives up.
    restarts = []
    for fault, backoff in ((0.0, 0.5), (0.3, 1.0), (0.6, 2.0)):
        assert decide(restarts, fault) == backoff
        restarts.append(fault)
    assert recent_restarts(restarts, 0.9, hour) == 3
    assert decide(restarts, 0.9) is None, "max_restarts=3: a fourth failure within the window gives up"
    # The window slides: an hour after the first of them, one relaunch has left it.
    assert recent_restarts(restarts, hour + 0.1, hour) == 2 and decide(restarts, hour + 0.1) == 2.0
    assert recent_restarts([0.0], hour, hour) == 0, "a relaunch exactly one window ago is out of it"


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_a_rank_error_names_its_last_line_and_innermost_frame_and_the_environment():
    from monarch_ft.records.reports import error_record

    def build(n_heads: int) -> None:
        raise ValueError(f"n_heads={n_heads}: does not divide dim 64")

    try:
        build(3)
    except ValueError as e:
        rec = error_record(e)
    assert rec["error"] == "ValueError: n_heads=3: does not divide dim 64"
    assert rec["error_type"] == "ValueError"
    assert rec["frame"].startswith("tests/test_recovery.py:") and rec["frame"].endswith(" in build"), rec
    assert rec["environmental"] is False
    assert error_record(_raised(FileNotFoundError(2, "No such file or directory", "/data/tokens.npy")))["environmental"] is False
    assert error_record(_raised(OSError(28, "No space left on device")))["error"] == "OSError: [Errno 28] No space left on device"
    # A connection, a timeout, torch.distributed's network/store/backend errors: not a crash loop.
    assert error_record(_raised(ConnectionRefusedError(111, "Connection refused")))["environmental"] is True
    assert error_record(_raised(TimeoutError("quorum timed out")))["environmental"] is True
    DistNetworkError = type("DistNetworkError", (RuntimeError,), {"__module__": "torch.distributed"})
    rec = error_record(_raised(DistNetworkError("failed to connect")))
    assert rec["environmental"] is True and rec["error_type"] == "torch.distributed.DistNetworkError"
    assert error_record(_raised(RuntimeError("boom")))["environmental"] is False


def test_the_same_failure_at_start_up_twice_in_a_row_is_a_crash_loop():
    from monarch_ft.controller.budget import crash_loop, startup_failure

    def err(rank: int, t: float, frame: str = "torchtitan/models/llama3/model/model.py:164 in apply_rotary_emb", kind: str = "RuntimeError", env: bool = False):
        error = f"{kind}: shape '[2, 64, 3, -1, 2]' is invalid"
        return {"rank": rank, "attempt": 0, "time": t, "error": error, "error_type": kind, "frame": frame, "environmental": env}

    first = startup_failure(False, [err(1, 10.2), err(0, 10.0)])
    assert first is not None and first["rank"] == 0, "the earliest error is the group's"
    assert not crash_loop(None, first), "one failure is not a loop"
    second = startup_failure(False, [{**err(0, 20.0), "error": "RuntimeError: shape '[2, 64, 3, -1, 2]' is invalid for 8064"}])
    assert crash_loop(first, second), "same type and frame; the message may differ"
    assert not crash_loop(first, startup_failure(False, [err(0, 30.0, frame="monarch_ft/data.py:200 in __init__")]))
    assert not crash_loop(first, startup_failure(False, [err(0, 30.0, kind="ValueError")]))
    # Not start-up failures: the attempt stepped; no rank reported an error (a signal, a
    # deliberate exit code); the earliest error is the environment's.
    assert startup_failure(True, [err(0, 1.0)]) is None
    assert startup_failure(False, []) is None
    assert startup_failure(False, [err(0, 1.0, env=True), err(1, 2.0)]) is None
    assert not crash_loop(first, None) and not crash_loop(None, None)


def test_the_job_fails_when_every_group_gave_up():
    from monarch_ft.records.events import GroupStatus, JobStatus
    from monarch_ft.controller.summary import job_outcome

    done, gone = GroupStatus.DONE, GroupStatus.GIVEN_UP
    assert job_outcome([done, done], regressed=False) is JobStatus.COMPLETED
    assert job_outcome([done, gone], regressed=False) is JobStatus.DEGRADED
    assert job_outcome([gone, gone], regressed=False) is JobStatus.FAILED
    assert job_outcome(["given_up"], regressed=False) is JobStatus.FAILED, "as read back from controller.json"
    assert job_outcome([done, done], regressed=True) is JobStatus.REGRESSED


def test_the_console_says_each_rollback_once_and_names_a_crash_loop_in_one_line():
    from monarch_ft.controller.budget import crash_loop_line
    from monarch_ft.controller.summary import rollback_lines

    back = {"steps_lost": 5, "from_step": 15, "to_step": 10, "reason": "no_live_peer", "group": 0}
    lines = rollback_lines([back, {**back, "group": 1}, back, back, {**back, "steps_lost": 10, "from_step": 20}])
    assert lines == [
        "the job went back 5 committed steps: from step 15 to its checkpoint at step 10, 4 times (no_live_peer: no group held the job's state)",
        "the job went back 10 committed steps: from step 20 to its checkpoint at step 10 (no_live_peer: no group held the job's state)",
    ]
    assert len(set(lines)) == len(lines)
    assert rollback_lines([]) == []
    failure = {"error": "ValueError: bad flavor", "error_type": "ValueError", "frame": "monarch_ft/rank/components/model.py:33 in model_args", "rank": 0}
    line = crash_loop_line(1, failure, "/run/logs/g1r0.a1.log")
    assert "\n" not in line and line.startswith("group 1 failed the same way on its last two launches")
    assert "ValueError: bad flavor (at monarch_ft/rank/components/model.py:33 in model_args)" in line
    assert "fix the config or the data" in line and "/run/logs/g1r0.a1.log" in line
