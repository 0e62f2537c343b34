"""Which nodes the controller keeps new allocations off, and when they return to the pool.

A node that fails shows to the controller seconds before the scheduler acts: every rank of
a group on it vanishes at once, none recording how it ended, while Slurm still counts the
node up until its pings go unanswered for ``SlurmdTimeout`` (300 s by default on a real
cluster). The controller relaunches at once (or promotes a standby and builds a new one),
and a job submitted then could be given the dead node again: it would not start until Slurm
failed it. So the node is *excluded* (``sbatch --exclude``) from the moment its group's
failure implicates it (:func:`node_suspicion`), and *returns* to the pool only once the
scheduler has counted it failed and then up again (its daemon back, the node resumed), or,
if the scheduler never counted it failed, after ``ft.node_probation_s`` (the suspicion was
wrong: the ranks were killed some other way). A process fault never excludes a node: its
task wrapper records the rank's exit.

Pure: what happened in, decisions out (unit-tested in tests/unit/test_placement.py);
:mod:`monarch_ft.controller.decide.job` (nodes) and the executor apply them to the launcher and the
event log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from monarch_ft.records.events import ExclusionReason, NodeHealth, ReturnReason
from monarch_ft.records.exits import LOST_EXIT


def node_suspicion(rank_exits: Sequence[Optional[int]], health: Optional[NodeHealth]) -> Optional[ExclusionReason]:
    """Why a group's failure implicates the node it ran on, or None (a fault of its processes).

    Args:
        rank_exits: each rank's exit code as known at the failure (None: still running;
            :data:`~monarch_ft.records.exits.LOST_EXIT`: gone without a record of how).
        health: the scheduler's view of the node then (None: not known).
    """
    if health in (NodeHealth.NOT_RESPONDING, NodeHealth.DOWN):
        return ExclusionReason.NOT_RESPONDING
    if rank_exits and all(code == LOST_EXIT for code in rank_exits):
        return ExclusionReason.RANKS_LOST
    return None


@dataclass
class Exclusion:
    """One node kept out of the pool.

    Args:
        node: the node.
        reason: why it was excluded.
        since: when.
        group: the group whose failure there excluded it.
        attempt: that group's attempt then.
        seen_down: the scheduler has counted it failed (not responding, down, out) since.
    """

    node: str
    reason: ExclusionReason
    since: float
    group: int
    attempt: int
    seen_down: bool = False


@dataclass(frozen=True)
class Return:
    """A node back in the pool: why, and after how long out."""

    node: str
    reason: ReturnReason
    excluded_s: float


@dataclass(frozen=True)
class Suspect:
    """A node a group's failure implicates (:func:`node_suspicion`), before anything is decided."""

    node: str
    reason: ExclusionReason


@dataclass
class NodePool:
    """The controller's exclusions, their returns, and the record of both for the summary: a
    part of the job's state (:class:`~monarch_ft.controller.state.JobState` ``nodes``), so a
    controller that takes the job over keeps its exclusions, and re-applies them.

    Args:
        probation_s: ``ft.node_probation_s``: how long a node the scheduler keeps counting up
            stays excluded before the suspicion is dropped.
        excluded: the nodes kept out now.
        history: every exclusion, with its return once it returned (the summary's).
        states: the scheduler's last view of every node (its own words), which also names the
            cluster's nodes.
        placements: allocations seen to start (groups' and standbys').
    """

    probation_s: float = 600.0
    excluded: dict[str, Exclusion] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    placements: int = 0
    # Pending allocations whose exclusions were asked to change: job id -> the nodes asked (a job
    # is asked again only for another set).
    replans: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def exclude(self, node: str, reason: ExclusionReason, now: float, group: int, attempt: int) -> Optional[Exclusion]:
        """Exclude ``node``; None when it already is (the first reason stands)."""
        if node in self.excluded:
            return None
        exclusion = Exclusion(node, reason, now, group, attempt)
        self.excluded[node] = exclusion
        self.history.append({"node": node, "reason": reason.value, "group": group, "attempt": attempt, "at": now, "returned_at": None, "return_reason": None})
        return exclusion

    def observe(self, health: Mapping[str, NodeHealth], now: float) -> list[Return]:
        """The scheduler's view of every node now; returns the nodes that go back to the pool.

        A node back to :attr:`NodeHealth.UP` after the scheduler counted it failed returns
        (:attr:`ReturnReason.BACK_UP`); one it counted up all along returns after
        ``probation_s`` (:attr:`ReturnReason.NEVER_DOWN`). A node the scheduler no longer
        lists stays excluded.
        """
        returned = []
        for node, exclusion in list(self.excluded.items()):
            state = health.get(node)
            if state is None:
                continue
            if state is not NodeHealth.UP:
                exclusion.seen_down = True
                continue
            if exclusion.seen_down:
                reason = ReturnReason.BACK_UP
            elif now - exclusion.since >= self.probation_s:
                reason = ReturnReason.NEVER_DOWN
            else:
                continue
            del self.excluded[node]
            back = Return(node, reason, round(now - exclusion.since, 3))
            for entry in self.history:
                if entry["node"] == node and entry["returned_at"] is None:
                    entry.update(returned_at=now, return_reason=reason.value, excluded_s=back.excluded_s)
            returned.append(back)
        return returned

    def with_suspects(self, suspects: Iterable[Suspect]) -> tuple[str, ...]:
        """The nodes new allocations are kept off once ``suspects`` are excluded too (changes
        nothing: the planner's view of an exclusion it decides, applied by the recovery)."""
        out = set(self.excluded) | {s.node for s in suspects}
        known = set(self.states)
        return () if known and known <= out else tuple(sorted(out))

    def to_exclude(self, nodes: Iterable[str]) -> set[str]:
        """The nodes new allocations are kept off, of the cluster's ``nodes``: the excluded
        ones, unless that is every node (then none: the scheduler's own view decides, and a
        job waits for a node to come back rather than being refused)."""
        known = set(nodes)
        out = set(self.excluded)
        return set() if known and known <= out else out

    def summary(self) -> dict:
        """Every exclusion with its return (``returned_at`` None: still excluded), the nodes excluded now, placements seen."""
        return {"exclusions": [dict(e) for e in self.history], "excluded_now": sorted(self.excluded), "placements": self.placements}
