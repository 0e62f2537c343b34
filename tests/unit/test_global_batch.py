"""ft.global_batch: the pure slot assignment and what the step records say a step consumed.
The rank side in a real job: tests/jobs/test_global_batch_jobs.py."""

from __future__ import annotations

import itertools

import pytest

from monarch_ft.records.global_batch import GlobalBatch, assign_slots, consumed, resolve, step_assignment, step_tokens


@pytest.mark.parametrize("groups", range(1, 7))
def test_every_slot_is_trained_exactly_once_whoever_takes_part(groups):
    """For every non-empty set of participants of every size: the lists partition the slots, each
    participant's starts with its own, and their lengths differ by at most one."""
    for size in range(1, groups + 1):
        for participants in itertools.combinations(range(groups), size):
            lists = assign_slots(groups, participants)
            assert set(lists) == set(participants)
            flat = [s for slots in lists.values() for s in slots]
            assert sorted(flat) == list(range(groups)), (participants, lists)
            assert all(slots[0] == p for p, slots in lists.items())
            lengths = [len(slots) for slots in lists.values()]
            assert max(lengths) - min(lengths) <= 1 and sum(lengths) == groups


def test_the_assignment_depends_on_the_participants_alone():
    # Any order the list arrives in gives the same lists: every participant computes the same.
    assert assign_slots(5, [3, 0]) == assign_slots(5, (0, 3)) == {0: (0, 1, 4), 3: (3, 2)}
    assert assign_slots(2, [0]) == {0: (0, 1)}
    assert assign_slots(4, [0, 1, 2, 3]) == {g: (g,) for g in range(4)}  # fault-free: its own only
    assert assign_slots(3, [0, 2]) == {0: (0, 1), 2: (2,)}  # G' not dividing G: 2 and 1


@pytest.mark.parametrize("participants", [[], [0, 0], [3], [-1]])
def test_participants_that_cannot_be_are_refused(participants):
    with pytest.raises(ValueError, match="need distinct groups in 0..2"):
        assign_slots(3, participants)


def test_auto_is_constant_where_it_is_built():
    assert resolve("auto", "hsdp") is GlobalBatch.CONSTANT
    assert resolve("auto", "diloco") is GlobalBatch.SHRINK and resolve("auto", "localsgd") is GlobalBatch.SHRINK
    assert resolve("shrink", "hsdp") is GlobalBatch.SHRINK and resolve("constant", "hsdp") is GlobalBatch.CONSTANT
    with pytest.raises(ValueError, match="ft.global_batch='grow': choose one of auto, constant, shrink"):
        resolve("grow", "hsdp")


def test_a_steps_slots_are_read_from_its_committed_records():
    both = {"committed": True, "participating_groups": [0, 1]}
    records = [
        # step 4, both groups, rank 0 and 1 (a rank repeats its group's slots: counted once)
        {"step": 4, "group": 0, "rank": 0, "slots": [0], **both},
        {"step": 4, "group": 0, "rank": 1, "slots": [0], **both},
        {"step": 4, "group": 1, "rank": 0, "slots": [1], **both},
        # step 5: group 1 heals (sends nothing, not counted), group 0 takes its slot
        {"step": 5, "group": 0, "rank": 0, "committed": True, "slots": [0, 1], "participating_groups": [0]},
        {"step": 5, "group": 1, "rank": 0, "committed": True, "slots": [], "participating_groups": [0]},
        # step 6: group 1 was counted in the sum and died before its record: its slot by the assignment
        {"step": 6, "group": 0, "rank": 0, "slots": [0], **both},
        # a step that failed consumed nothing; a record without slots is skipped
        {"step": 7, "group": 0, "rank": 0, "committed": False, "slots": [0, 1], "participating_groups": [0]},
        {"step": 8, "group": 0, "rank": 0, "committed": True},
        # a slot trained by two groups in one step shows twice
        {"step": 9, "group": 0, "rank": 0, "slots": [0, 1], **both},
        {"step": 9, "group": 1, "rank": 0, "slots": [1], **both},
    ]
    assert consumed(records, 2, GlobalBatch.CONSTANT) == {4: [0, 1], 5: [0, 1], 6: [0, 1], 9: [0, 1, 1]}
    # shrink: a group trains its own slot only, so a step of one group consumed one slot
    shrunk = [{"step": 3, "group": 0, "rank": 0, "committed": True, "slots": [0], "participating_groups": [0]}]
    assert consumed(shrunk, 2, GlobalBatch.SHRINK) == {3: [0]}
    assert step_assignment(GlobalBatch.SHRINK, 3, [2, 0]) == {0: (0,), 2: (2,)}
    assert step_tokens(3, 2, 4, 64) == 3 * 2 * 4 * 64
    with pytest.raises(ValueError, match="step 4: records name different participants"):
        consumed([*records[:2], {**records[2], "participating_groups": [1]}], 2, GlobalBatch.CONSTANT)
