"""The job's committed step (monarch_ft.controller.ledger): commits read in any order, one that
went back, a step redone by a later quorum; and the drill's own check of the same rule."""

from __future__ import annotations

from monarch_ft.controller.ledger import CommitLedger


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


def test_drill_check_reads_quorums_not_record_times():
    from chaos.mttr import steps_never_go_back

    def commit(group, attempt, step, quorum, t):
        return {"group": group, "rank": 0, "attempt": attempt, "step": step, "quorum_id": quorum, "time": t, "committed": True}

    late = [commit(0, 1, 366, 7, 1.44), commit(0, 1, 367, 8, 3.69), commit(2, 0, 366, 7, 3.76), commit(2, 0, 368, 9, 4.97)]
    assert steps_never_go_back(late)
    assert not steps_never_go_back([commit(0, 0, 2509, 40, 1.0), commit(1, 1, 0, 41, 2.0)])
    assert not steps_never_go_back([commit(0, 0, 12, 3, 1.0), commit(0, 0, 12, 3, 2.0)])  # one attempt twice


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


def test_the_ledger_answers_as_a_scan_of_every_earlier_quorum_would_in_any_order():
    """CommitLedger keeps prefix maxima over the quorum ids instead of scanning every quorum per
    record: commits read in any order, late ones in old quorums, rollbacks, all answer alike."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        ledger, newest = CommitLedger(), {}
        for _ in range(rng.randint(1, 60)):
            if rng.random() < 0.03:
                ledger.rollback(rng.randint(0, 5))
                newest.clear()
                continue
            step, quorum = rng.randint(0, 30), rng.randint(0, 12)
            newest[quorum] = max(step, newest.get(quorum, step))
            earlier = max((s for q, s in newest.items() if q < quorum), default=-1)
            assert ledger.record(step, quorum) == (earlier if earlier > step else None)
