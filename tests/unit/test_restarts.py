"""How a failed group is relaunched and how a job ends: the restart budget as a rate and its
backoff, crash loops (monarch_ft.controller.budget), the start gate (gates), the job's
outcome and the console's end lines (summary)."""

from __future__ import annotations


def test_restart_backoff_doubles_to_its_cap_then_the_budget_gives_up():
    from monarch_ft.controller.budget import restart_backoff

    assert [restart_backoff(n, 5, 0.5, 3.0) for n in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, None]
    assert restart_backoff(0, 0, 0.5, 8.0) is None, "ft.max_restarts=0: a failed group is never relaunched"


def test_start_gate_waits_for_every_group_or_half_the_startup_timeout():
    from monarch_ft.controller.gates import start_gate_opens

    assert start_gate_opens(True, 0.0, 120.0)
    assert not start_gate_opens(False, 59.0, 120.0)
    assert start_gate_opens(False, 61.0, 120.0), "a group that cannot start does not hold the others"


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
    from monarch_ft.controller.summary import job_outcome
    from monarch_ft.records.events import GroupStatus, JobStatus

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
    failure = {"error": "ValueError: bad flavor", "error_type": "ValueError", "frame": "monarch_ft/components/model.py:33 in model_args", "rank": 0}
    line = crash_loop_line(1, failure, "/run/logs/g1r0.a1.log")
    assert "\n" not in line and line.startswith("group 1 failed the same way on its last two launches")
    assert "ValueError: bad flavor (at monarch_ft/components/model.py:33 in model_args)" in line
    assert "fix the config or the data" in line and "/run/logs/g1r0.a1.log" in line
