"""chaos.mttr on recorded event and metric fixtures: the MTTR phases, recovery and what a fault cost.

The fixtures are what a 2 groups x 2 ranks drill writes (events.jsonl, metrics.jsonl),
cut down to the records the analysis reads, with round times so every phase is exact.
"""

from __future__ import annotations

import pytest

from chaos.mttr import analyze_fault, batch_accounting, steps_never_go_back
from monarch_ft.records.events import PHASES

T0 = 100.0  # the fault's injection time


def commits(group, steps, t_first, members, attempt=0, ranks=(0, 1), dt=1.0, **extra):
    """Committed step records of ``group``'s ranks, one step every ``dt`` seconds."""
    return [
        {
            "group": group,
            "rank": r,
            "attempt": attempt,
            "step": s,
            "committed": True,
            "participating_groups": list(members),
            "time": t_first + i * dt,
            "quorum_id": 1 + attempt,
            **extra,
        }
        for i, s in enumerate(steps)
        for r in ranks
    ]


def ev(event, time, **fields):
    return {"event": event, "time": time, **fields}


def fault(kind, target=1, step=9, attempt=0, **extra):
    return {"id": 0, "kind": kind, "target": target, "rank": 0, "at_step": step, "injected_at": T0, "step": step, "attempt": attempt, **extra}


def analyze(f, events, metrics, full_restart=False, until=float("inf")):
    return analyze_fault(f, events, metrics, full_restart, replica_groups=2, ranks_per_group=2, until=until)


def _before():
    # Both groups commit steps 0..9 together, one a second, up to the fault.
    return commits(0, range(10), 90.0, [0, 1]) + commits(1, range(10), 90.0, [0, 1])


def _killed_and_healed(hash_g1="h"):
    """process_kill of group 1 at step 9: group 0 steps alone (10..18), group 1's second attempt
    is up at +9 s, heals from group 0 and commits with it from step 19 (+10 s)."""
    metrics = _before() + commits(0, range(10, 19), 101.0, [0])
    metrics += commits(0, range(19, 25), 110.0, [0, 1], state_hash="h") + commits(1, range(19, 25), 110.0, [0, 1], attempt=1, state_hash=hash_g1)
    events = [
        ev("group_failed", T0 + 0.05, group=1, attempt=0, reason="exit", rank=0, signal="SIGKILL"),
        ev("group_launched", T0 + 0.6, group=1, attempt=1),
        ev("model_ready", 108.0, group=1, rank=0, attempt=1),
        ev("model_ready", 109.0, group=1, rank=1, attempt=1),
        ev("weights_recovered", 109.5, group=1, rank=0, attempt=1, bytes=1000, seconds=0.1, src_group=0),
        ev("weights_recovered", 109.6, group=1, rank=1, attempt=1, bytes=1000, seconds=0.2, src_group=0),
    ]
    return events, metrics


def test_a_killed_group_healed_from_its_peer_has_every_phase():
    events, metrics = _killed_and_healed()
    a = analyze(fault("process_kill"), events, metrics)
    assert a["phases"] == {"detected": 0.05, "survivors_stepping": 1.0, "replacement_up": 9.0, "weights_recovered": 9.6, "back_in_quorum": 10.0}
    assert list(a["phases"]) == list(PHASES)
    assert a["mttr_s"] == 10.0 and a["recovered"] is True and a["weights_consistent"] is True
    # Group 0's longest gap between commits spans the fault (step 9 at 99 s, step 10 at 101 s); no step went back.
    assert a["survivor_max_stall_s"] == 2.0 and a["survivor_steps_lost"] == 0 and a["job_steps_lost"] == 0
    assert a["recovery_bytes"] == 2000 and a["recovery_seconds"] == 0.2 and a["recovered_from_group"] == 0
    assert a["injected_step"] == 9 and a["kind"] == "process_kill"


def test_back_with_other_weights_is_not_recovered():
    events, metrics = _killed_and_healed(hash_g1="other")
    a = analyze(fault("process_kill"), events, metrics)
    assert a["mttr_s"] == 10.0 and a["weights_consistent"] is False and a["recovered"] is False


def test_a_group_back_alone_or_behind_the_job_is_not_back():
    # The relaunched group commits, but alone and from its initial weights (step 0): not a recovery.
    metrics = _before() + commits(0, range(10, 30), 101.0, [0]) + commits(1, range(0, 5), 110.0, [1], attempt=1)
    events = [ev("group_failed", T0 + 0.05, group=1, attempt=0, reason="exit", rank=0)]
    a = analyze(fault("process_kill"), events, metrics)
    assert a["phases"]["back_in_quorum"] is None and a["mttr_s"] is None and a["recovered"] is False


def test_a_hang_is_detected_at_the_supervisors_hang_verdict():
    # SIGSTOP on group 1's rank 1: silent until the 6 s hang timeout, then the group fails (which rank
    # is blamed is monarch_ft.controller.hangs.find_hang's decision: tests/unit/test_hangs.py).
    events, metrics = _killed_and_healed()
    events[0] = ev("group_failed", T0 + 6.0, group=1, attempt=0, reason="hung", rank=1, phase="compute", silent_s=6.0)
    metrics = [m for m in metrics if not (m["group"] == 0 and 101.0 <= m["time"] < T0 + 6.0)]  # group 0 waits for the hung peer
    a = analyze(fault("hang", rank=1), events, metrics)
    assert a["phases"]["detected"] == 6.0 and a["phases"]["survivors_stepping"] == 6.0
    assert a["survivor_max_stall_s"] == 7.0  # step 9 at 99 s to the first step without group 1 at 106 s
    assert a["recovered"] is True and a["mttr_s"] == 10.0


def test_a_collective_fault_the_rank_never_acted_on_never_fired():
    """The request was written, but no rank took it (the job ended, the rank was elsewhere): no
    detection, no recovery, whatever the group committed afterwards."""
    metrics = _before() + commits(0, range(10, 20), 100.5, [0, 1]) + commits(1, range(10, 20), 100.5, [0, 1])
    a = analyze(fault("collective", mode="abort"), [], metrics)
    assert a["phases"] == dict.fromkeys(PHASES) and a["mttr_s"] is None and a["recovered"] is False


def test_a_collective_abort_is_one_refused_step_and_no_restart():
    metrics = _before() + commits(0, [10], 100.5, [0, 1]) + commits(1, [10], 100.5, [0, 1])
    # The rank aborts its process group at 101.2; that step (11) is refused by both groups, the next commits.
    metrics += [{**m, "committed": False} for m in commits(0, [11], 101.5, [0, 1]) + commits(1, [11], 101.5, [0, 1])]
    metrics += commits(0, range(11, 15), 102.0, [0, 1]) + commits(1, range(11, 15), 102.0, [0, 1])
    events = [ev("collective_fault_injected", 101.2, group=1, rank=0, attempt=0, mode="abort")]
    a = analyze(fault("collective", mode="abort"), events, metrics)
    assert a["phases"] == {"detected": 1.5, "survivors_stepping": 2.0, "replacement_up": None, "weights_recovered": None, "back_in_quorum": 2.0}
    # Each group's step 11 was trained and thrown away: one step of each.
    assert a["recovered"] is True and a["group_steps_discarded"] == 2


def test_a_full_restart_resumes_every_group_at_one_step_and_counts_the_redone_steps():
    """ft.recovery=full_restart: both groups stop and load checkpoint step 8 behind one start gate."""
    metrics = _before()
    events = [ev("group_failed", T0 + 0.05, group=1, attempt=0, reason="exit", rank=0), ev("full_restart", T0 + 0.1, failed_group=1, resume_step=8)]
    for g in (0, 1):
        events.append(ev("group_launched", T0 + 0.5, group=g, attempt=1))
        for r in (0, 1):
            events.append(ev("model_ready", 110.0 + r, group=g, rank=r, attempt=1))
            events.append(ev("checkpoint_loaded", 111.5 + r / 10, group=g, rank=r, attempt=1, step=8))
        metrics += commits(g, range(8, 16), 113.0, [0, 1], attempt=1, state_hash="h")
    a = analyze(fault("process_kill"), events, metrics, full_restart=True)
    # Survivors: the first commit of any group after detection, i.e. the resumed job's.
    assert a["phases"] == {"detected": 0.05, "survivors_stepping": 13.0, "replacement_up": 11.0, "weights_recovered": 11.6, "back_in_quorum": 14.0}
    # Back: at the job's step when the fault hit (9), not the older checkpoint step (8).
    assert a["recovered"] is True and a["weights_consistent"] is True
    # Group 0 went from step 9 back to 8: two steps done again, 14 s without a commit.
    assert a["survivor_steps_lost"] == 2 and a["survivor_max_stall_s"] == 14.0
    # Full restarts go back by design (a quorum commits a step below an earlier quorum's).
    assert not steps_never_go_back(metrics) and steps_never_go_back(_killed_and_healed()[1])


def test_a_partition_counts_from_the_drop_to_the_commit_after_the_link_is_back():
    metrics = _before() + commits(0, range(10, 20), 101.0, [0]) + commits(1, range(10, 12), 100.5, [1], committed_alone=True)
    metrics += commits(0, range(20, 25), 112.0, [0, 1]) + commits(1, range(20, 25), 112.0, [0, 1])
    events = [ev("link_restored", 110.0, group=1)]
    a = analyze(fault("partition", duration_s=10), events, metrics)
    assert a["phases"]["detected"] == 1.0 and a["phases"]["replacement_up"] is None
    assert a["phases"]["back_in_quorum"] == 12.0 and a["recovered"] is True
    never = analyze(fault("partition", duration_s=10), [], metrics)
    assert never["mttr_s"] is None and never["recovered"] is False, "no link_restored: the link never came back"


def test_events_after_the_next_fault_belong_to_it():
    events, metrics = _killed_and_healed()
    a = analyze(fault("process_kill"), events, metrics, until=105.0)
    assert a["phases"]["detected"] == 0.05 and a["phases"]["replacement_up"] is None and a["mttr_s"] is None


@pytest.mark.parametrize("mode, expected_kept", [("hsdp", [0, 1, 2, 3]), ("diloco", [0, 1, 2, 3])])
def test_batch_accounting_keeps_committed_windows_and_drops_a_dead_groups_tail(mode, expected_kept):
    sync_every = 1 if mode == "hsdp" else 2
    rows = []
    for s in range(4):
        synced = (s + 1) % sync_every == 0
        rows.append({"group": 0, "rank": 0, "attempt": 0, "step": s, "batch": s, "sync": synced, "committed": synced, "time": 1.0 + s})
    # Group 1 trains batches 0-2 (window 2-3 unsynced) and dies.
    for s in range(3):
        synced = (s + 1) % sync_every == 0
        rows.append({"group": 1, "rank": 0, "attempt": 0, "step": s, "batch": s, "sync": synced, "committed": synced, "time": 1.0 + s})
    acc = batch_accounting(rows)
    assert acc["kept"][0] == expected_kept
    tail = [d for d in acc["discarded"] if d["group"] == 1]
    assert tail == [{"group": 1, "attempt": 0, "steps": 1, "time": 3.0, "tail": True}] if mode == "diloco" else tail == []


def test_a_bitflip_is_detected_at_the_controller_s_verdict_with_its_steps():
    """bitflip on group 1 lands at its step 10, the vote blames it at step 11 (the fault's
    detection, and the step it was caught at), it is relaunched and back at step 19."""
    metrics = _before() + commits(0, range(10, 19), 101.0, [0]) + commits(0, range(19, 25), 110.0, [0, 1], state_hash="h")
    metrics += commits(1, [10], 100.5, [0, 1]) + commits(1, range(19, 25), 110.0, [0, 1], attempt=1, state_hash="h")
    events = [
        ev("bitflip_injected", T0 + 0.2, group=1, rank=0, attempt=0, step=10),
        ev("sdc_detected", T0 + 1.5, group=1, attempt=0, step=11, action="fail_group"),
        ev("group_failed", T0 + 1.55, group=1, attempt=0, reason="corrupt"),
        ev("group_launched", T0 + 2.0, group=1, attempt=1),
        ev("model_ready", T0 + 8.0, group=1, rank=0, attempt=1),
        ev("model_ready", T0 + 8.5, group=1, rank=1, attempt=1),
        ev("weights_recovered", T0 + 9.5, group=1, rank=0, attempt=1, bytes=10, src_group=0),
        ev("weights_recovered", T0 + 9.6, group=1, rank=1, attempt=1, bytes=10, src_group=0),
    ]
    a = analyze(fault("bitflip", step=9), events, metrics)
    assert a["phases"]["detected"] == 1.5 and a["phases"]["replacement_up"] == 8.5 and a["phases"]["weights_recovered"] == 9.6
    assert a["phases"]["back_in_quorum"] == 10.0 and a["recovered"] and a["weights_consistent"] is True
    assert (a["hit_step"], a["detected_step"], a["detection_latency_steps"]) == (10, 11, 1)


def test_a_recorded_integrity_rollback_is_not_a_step_going_back():
    metrics = commits(0, range(0, 14), 0.0, [0, 1]) + commits(0, range(10, 16), 20.0, [0, 1], attempt=1)
    for m in metrics:
        m["quorum_id"] = 1 if m["attempt"] == 0 else 2
    assert not steps_never_go_back(metrics)
    assert steps_never_go_back(metrics, [{"event": "job_rollback", "time": 15.0, "to_step": 10, "reason": "replicas_diverged"}])


# ---------------------------------------------------------------- throughput around a fault
def _commits(times, first_step=0, group=0):
    return [{"group": group, "rank": 0, "step": first_step + i, "committed": True, "time": t} for i, t in enumerate(times)]


def test_throughput_counts_group_steps_and_honours_since():
    from chaos.mttr import step_rate, throughput

    # Both groups at 2 steps/s (4 group-steps/s) after an earlier disruption that ended at t=5
    # (0.2 steps/s before it); a fault at t=20 leaves group 0 alone at 0.5 steps/s for 10 steps;
    # both back from t=40 at 1.8 steps/s (3.6 group-steps/s).
    slow = [i * 5.0 - 20.0 for i in range(5)]  # t=-20..0, the earlier disruption
    before = [5.0 + i * 0.5 for i in range(30)]
    during = [20.0 + 2.0 * (i + 1) for i in range(10)]
    after = [40.0 + (i + 1) / 1.8 for i in range(40)]
    records = _commits(slow + before + during + after)
    records += _commits(slow + before, group=1) + _commits(after, first_step=len(slow) + len(before) + len(during), group=1)
    for m in records:
        m["participating_groups"] = [0] if 20.0 < m["time"] <= 40.0 else [0, 1]
    rates = throughput(records, t0=19.9, back_at=40.0, since=5.0)
    # Group-steps, not distinct steps: two groups stepping count twice a lone one's pace.
    assert rates["before"] == pytest.approx(4.0, rel=0.05) and rates["during"] == pytest.approx(0.5, rel=0.05)
    assert rates["after"] == pytest.approx(3.6, rel=0.05) and rates["ratio"] == pytest.approx(0.9, rel=0.05)
    assert rates["since"] == 5.0 and rates["why"] is None
    # Without since, the earlier disruption's slow steps would be part of "before" when it is short.
    assert step_rate(records, -30.0, 19.9) < step_rate(records, 5.0, 19.9)
    missing = throughput(records, t0=19.9, back_at=None)
    assert missing["after"] is None and missing["ratio"] is None and missing["why"] == "not recovered"
    no_before = throughput(records, t0=19.9, back_at=40.0, since=19.5)
    assert no_before["ratio"] is None and "previous fault" in no_before["why"]
    assert step_rate(records, 0.1, 5.4) is None  # 2 group-steps: no rate


def test_a_slow_fault_evicted_is_measured_after_its_standby_is_back(tmp_path):
    from chaos.mttr import analyze_fault

    # group 1 slowed at t=10 (step 20): the job goes at 1 step/s; evicted at t=15, its
    # standby (attempt 1) commits with the others from t=17 at 2 steps/s again; the slowdown
    # itself ends only at t=40.
    records = []
    t, step = 0.0, 0
    while t < 60:
        for g in range(3):
            attempt = 1 if (g == 1 and t >= 17) else 0
            members = [0, 2] if 15 <= t < 17 else [0, 1, 2]
            if g in members:
                records.append({"group": g, "rank": 0, "attempt": attempt, "step": step, "committed": True, "time": t, "participating_groups": members})
        t += 1.0 if 10 <= t < 15 else 0.5
        step += 1
    events = [
        {"event": "straggler_detected", "group": 1, "time": 14.0},
        {"event": "straggler_evicted", "group": 1, "time": 15.0},
        {"event": "group_failed", "group": 1, "attempt": 0, "reason": "straggler", "time": 15.0},
        {"event": "group_launched", "group": 1, "attempt": 1, "time": 15.1},
        {"event": "slowdown_ended", "group": 1, "time": 40.0},
    ]
    fault = {"id": 0, "kind": "slow", "target": 1, "rank": 0, "at_step": 20, "injected_at": 10.0, "attempt": 0, "step": 19, "members": [0, 1, 2]}
    out = analyze_fault(fault, events, records, False, 3, 1)
    assert out["evicted"] is True and out["recovered"] is True
    rates = out["throughput_group_steps_per_s"]
    # Group-steps: three groups at 2 steps/s before and after.
    assert rates["before"] == pytest.approx(6.0, rel=0.05) and rates["after"] == pytest.approx(6.0, rel=0.05)
    assert out["throughput_ratio"] == pytest.approx(1.0, rel=0.05)
    assert rates["during"] < 4.5  # a third of the group-steps or more lost while it lasted
