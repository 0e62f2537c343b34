"""Which data slots this group trains at a step (``ft.global_batch``), from the step's quorum.

The assignment itself is a pure function of the participants (monarch_ft.records.global_batch);
this module learns the participants of a step, the same list on every participant and on every
rank of a group, and hands the group its slots. ``ft.mode=hsdp`` only: that is where
``constant`` is built (monarch_ft.config.ft says why not in the semi-synchronous modes).

When the participants are known. The quorum of a step (TorchFT's asynchronous quorum in hsdp) is
computed while the group trains its own slot, and the participants of the step are the groups at
the quorum's newest step: a group behind it heals in that step and sends zeros (torchft's
``Manager.is_participating``). Every member of the quorum receives the same quorum, so when no
group heals in it (:attr:`QuorumView.all_current`, every step but a heal's) the participants are
its groups, known without a collective. When one heals, which groups are behind is in no field
of the quorum, so the participants learn it from one small collective through the Manager, which
sends a healing group's contribution as zeros: the groups whose one-hot slot comes back non-zero
are the participants. Every member of the quorum joins it (its need is in the quorum itself), the
healing group too, which is then told it trains nothing: it must not consume its own slot, whose
gradient the Manager discards; a participant takes it. Groups of several ranks agree on the list
(the lowest of each slot across the group's ranks), so a rank whose collective failed cannot
train a different number of micro-batches than its peers and hang their FSDP collectives; the
step is not committed then anyway (the failed rank votes against it).

What a step then committed is checked by the gradient sum itself (rank.components.ft.GradSync:
the groups counted and the micro-batches summed): a participant that finds other groups counted,
or not every slot summed, votes against the commit, so no committed step holds a slot twice or
misses one (Trainer.train_step).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from monarch_ft.records.global_batch import GlobalBatch, step_assignment
from monarch_ft.rank.components.ft import MonarchManager
from monarch_ft.rank.components.torchft_compat import quorum_pending


class StepSlots:
    """This group's slots at each step.

    Args:
        policy: ``ft.global_batch``, resolved for hsdp.
        num_groups: ``ft.replica_groups`` (the slots of a step).
        group: this replica group.
        group_min: the lowest value of a tensor across this group's ranks, in place (identity
            for a group of one rank).
        device: where the cross-group collective's tensors live (the rank's device).
    """

    def __init__(self, policy: GlobalBatch, num_groups: int, group: int, group_min: Callable[[torch.Tensor], None], device: torch.device) -> None:
        self.policy, self.num_groups, self.group = policy, num_groups, group
        self._group_min = group_min
        self.device = device

    @property
    def constant(self) -> bool:
        return self.policy is GlobalBatch.CONSTANT

    def slots(self, manager: MonarchManager, training: bool) -> Tuple[int, ...]:
        """The slots this group trains at the step whose quorum ``manager`` started: its own first
        (trained before this call, while the quorum ran), then any absent group's it takes; ()
        when it trains nothing (``training`` False, or it heals in this step under ``constant``).

        Under ``constant`` every member of the quorum must call this, training or not: a step in
        which a group heals runs one collective here (see the module doc).

        Args:
            manager: the rank's Manager, its quorum for the step started.
            training: this group trains this step (False: it holds past the finish).
        """
        if not self.constant:
            return (self.group,) if training else ()
        participants = self.participants(manager)
        if not training or participants is None or self.group not in participants:
            return ()
        return step_assignment(self.policy, self.num_groups, participants)[self.group]

    def may_wait(self, manager: MonarchManager) -> bool:
        """Whether :meth:`slots` may wait on other groups at this step, told without waiting. Only
        under ``constant``: for the step's quorum while it still runs, and for the collective of
        a step in which a group heals (:meth:`participants`). That collective completes only once
        the healing group has received its state and joined it: the heal's length, seconds on a
        slow link or for a large model, spent asleep by every other group. Both are waits on
        other groups, which the trainer marks as its sync phase (the hang rules' budget for
        them), not as compute.

        Args:
            manager: the rank's Manager, its quorum for the step started.
        """
        if not self.constant:
            return False
        if quorum_pending(manager):
            return True
        quorum = manager.quorum
        return quorum is not None and not quorum.all_current and manager.errored() is None

    def participants(self, manager: MonarchManager) -> Optional[Tuple[int, ...]]:
        """The groups whose gradients this step sums, ascending; None when the quorum failed."""
        manager.wait_quorum()
        quorum = manager.quorum
        if quorum is None or manager.errored() is not None:
            return None
        if quorum.all_current:
            return tuple(g for g in quorum.groups if g < self.num_groups)
        onehot = torch.zeros(self.num_groups, dtype=torch.float32, device=self.device)
        onehot[self.group] = 1.0
        work = manager.allreduce(onehot, reduce_op=torch.distributed.ReduceOp.SUM)
        work.wait()
        if manager.errored() is not None:
            onehot.zero_()
        self._group_min(onehot)
        found = tuple(i for i in range(self.num_groups) if onehot[i].item() > 0)
        return found or None
