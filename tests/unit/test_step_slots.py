"""When the rank's slot exchange (rank.components.global_batch.StepSlots) may wait on other groups:
the trainer marks that wait as its sync phase, which the hang rules budget apart from compute.
A fake Manager: only the quorum's state matters here. The real job: tests/jobs/test_global_batch_jobs.py."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Optional

import pytest
import torch

from monarch_ft.rank.components.global_batch import StepSlots
from monarch_ft.rank.components.torchft_compat import QuorumView
from monarch_ft.records.global_batch import GlobalBatch


class _Manager:
    """What may_wait reads of torchft's Manager: its quorum future, the quorum seen, its error."""

    def __init__(self, pending: bool, healing: int = 0, error: Optional[Exception] = None) -> None:
        self._quorum_future: Future = Future()
        if not pending:
            self._quorum_future.set_result(None)
        groups = (0, 1, 2)
        self.quorum = QuorumView(quorum_id=3, groups=groups, max_world_size=len(groups) - healing, at_max_step=True, max_step=40)
        self._error = error

    def errored(self) -> Optional[Exception]:
        return self._error


def _slots(policy: GlobalBatch) -> StepSlots:
    return StepSlots(policy, 3, 0, lambda t: None, torch.device("cpu"))


@pytest.mark.parametrize(
    "manager, waits",
    [
        (_Manager(pending=True), True),  # the quorum still runs: slots() waits for it
        (_Manager(pending=False), False),  # in, nobody heals: the participants are the quorum's groups
        # In, a group heals in it: the participants' collective waits for that heal (a slow link
        # or a large model: seconds). Marked compute, the survivors were judged hung.
        (_Manager(pending=False, healing=1), True),
        (_Manager(pending=False, healing=1, error=RuntimeError("the quorum failed")), False),  # no collective then
    ],
)
def test_constant_waits_for_the_quorum_and_for_a_heal_in_it(manager, waits):
    assert _slots(GlobalBatch.CONSTANT).may_wait(manager) is waits


@pytest.mark.parametrize("manager", [_Manager(pending=True), _Manager(pending=False, healing=1)])
def test_shrink_never_waits_in_its_slots(manager):
    assert _slots(GlobalBatch.SHRINK).may_wait(manager) is False
