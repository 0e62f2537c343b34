"""The job's committed step, kept by the controller from the ranks' commit records.

The job's committed step never goes back except by an explicit, recorded rollback to a
disk checkpoint (every group holding it was lost). :class:`CommitLedger` tells a commit
that went back (a regression: a group trained on a stale state) from one merely read
late, and :func:`redone_commit` a step trained twice, from records read in any order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

from monarch_ft.controller.snapshot import own


@dataclass
class CommitLedger:
    """The job's committed step, and commits that went back, from records read in any order.

    Record order and wall-clock time do not tell a regression: TorchFT's ``should_commit``
    agrees within one replica group only, so a slow group may write its commit of step s
    after another group, which went on in the next quorum without it, committed s+1; that
    commit of s was legitimate. Quorums do tell: each quorum starts from its participants'
    newest step (the others heal to it), so a later quorum (a higher Lighthouse quorum id)
    never commits a lower step than an earlier one did, unless it started from a state the
    job had left behind (a group alone with its initial weights). So a commit of step s in
    quorum q went back iff some quorum before q committed a step above s.
    """

    # The Manager's step after the newest commit (steps committed).
    job_step: int = 0
    # Quorum id -> the newest step committed in it.
    newest: dict[int, int] = field(default_factory=dict)
    # The quorum ids in order and the highest step committed up to each (prefix maxima): what
    # an earlier quorum committed, by bisection. Worked out again when a quorum id is new or a
    # quorum other than the newest commits a higher step (a scan of every quorum per commit
    # record grew with the job: 7% of the controller's CPU at 1,024 groups, 200 quorums).
    _ids: Optional[list[int]] = own(None)
    _highest: list[int] = own(default_factory=list)

    def record(self, step: int, quorum_id: int) -> Optional[int]:
        """Take a commit of ``step`` in quorum ``quorum_id``; returns the higher step an
        earlier quorum committed (a regression), or None."""
        self.job_step = max(self.job_step, step + 1)
        was = self.newest.get(quorum_id)
        now = step if was is None else max(was, step)
        self.newest[quorum_id] = now
        ids = self._ids
        if ids is None or was is None or (now != was and quorum_id != ids[-1]):
            ids = self._ids = sorted(self.newest)
            self._highest = []
            for q in ids:
                self._highest.append(max(self.newest[q], self._highest[-1] if self._highest else -1))
        # Only the quorums before this one: the prefix maxima up to the one before it.
        before = bisect.bisect_left(ids, quorum_id)
        earlier = self._highest[before - 1] if before else -1
        return earlier if earlier > step else None

    def rollback(self, step: int) -> None:
        """The job explicitly went back to a checkpoint at ``step`` (its state was lost)."""
        self.job_step = step
        self.newest.clear()
        self._ids = None


def redone_commit(seen: dict[int, tuple[int, str]], quorum_id: int, group: int, state_hash: str) -> Optional[dict]:
    """A commit of a step another quorum committed with other weights: the step was redone.

    Every member of one quorum commits a step with the same weights; two quorums commit the
    same step only when a group trained it again from the step before. That happens when the
    only group holding a commit dies before a healing peer joins it (TorchFT's semantics: the
    survivor's state is the job's). The job's step does not go back, so CommitLedger sees no
    regression, yet the dead group's update of that step is gone: a step redone. Only a
    difference of weights proves it (a record's quorum id alone can name the next quorum,
    configured while the step ran), so it is told from the state hashes of one rank index.

    Args:
        seen: for one step and rank index, quorum id -> (group, state hash) already committed.
        quorum_id, group, state_hash: the new commit of that step.

    Returns:
        The other quorum's commit (``quorum_id``, ``group``) it contradicts, or None; ``seen``
        is updated. Records are read in any order (one report file after another), so the
        other commit may be the later one: the caller tells which by the quorum ids.
    """
    other = None
    for q, (g, h) in seen.items():
        if q != quorum_id and h != state_hash:
            other = {"quorum_id": q, "group": g}
    seen.setdefault(quorum_id, (group, state_hash))
    return other
