"""monarch_ft.common.heap: what survives a full collection is frozen while the watch loop runs."""

from __future__ import annotations

import gc

from monarch_ft.common.heap import survivors_frozen


def test_survivors_of_a_full_collection_are_frozen_and_given_back_at_the_end():
    assert gc.get_freeze_count() == 0
    kept = [[i] for i in range(1000)]
    with survivors_frozen():
        gc.collect(1)
        assert gc.get_freeze_count() == 0  # a young collection freezes nothing
        gc.collect()
        assert gc.get_freeze_count() >= len(kept)
        # Garbage is still freed by its count, and a new cycle by the next full collection.
        cycle: list = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0
