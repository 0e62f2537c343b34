"""The hang model (monarch_ft.controller.hangs) on plain values: phases and their budgets, OS
states held over time, CPU use, the learned hang timeout, and one job-wide stall."""

from __future__ import annotations

import dataclasses

import pytest

from monarch_ft.config.ft import hang_timeout_setting
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
    track_cpu,
    track_os_state,
)
from monarch_ft.records.phases import Phase
from monarch_ft.records.stats import percentile

LIMITS = HangLimits(hang_timeout_s=6, startup_timeout_s=120, save_timeout_s=30, sync_budget_s=36)


# ---------------------------------------------------------------- hangs
def _view(rank, silent=0.5, phase=Phase.COMPUTE, phase_s=0.5, os_state="sleeping", started=True):
    return RankView(rank=rank, silent_s=silent, started=started, phase=phase.value, phase_s=phase_s, os_state=os_state)


def test_a_long_save_or_a_wait_in_torchft_is_not_a_hang():
    assert find_hang([_view(0, phase=Phase.SAVE, phase_s=20)], LIMITS) is None
    assert find_hang([_view(0, phase=Phase.SYNC, phase_s=30)], LIMITS) is None
    assert find_hang([_view(0, phase=Phase.GATE, phase_s=500)], LIMITS) is None


def test_a_save_that_silences_its_rank_gets_the_save_budget_not_the_hang_timeout():
    # Its liveness beats late while the save holds the GIL or waits on the disk (every group saves at once).
    assert find_hang([_view(0, silent=10, phase=Phase.SAVE, phase_s=10)], LIMITS) is None
    assert find_hang([_view(0, silent=34, phase=Phase.SAVE, phase_s=34)], LIMITS).rank == 0
    # The same silence outside a save is a hang.
    assert find_hang([_view(0, silent=10, phase=Phase.COMPUTE, phase_s=1)], LIMITS).rank == 0


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
