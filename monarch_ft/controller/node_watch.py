"""The controller's watch of a cluster's nodes: where each job went, what the scheduler sees,
and which nodes new allocations are kept off (:mod:`monarch_ft.controller.placement` decides).

The watch loop calls :meth:`NodeWatch.tick` once per tick and :meth:`NodeWatch.group_failed`
when a group fails; both do nothing for a launcher without nodes (local processes, Monarch),
whose ``node_states`` is empty. Everything it learns goes to the event log: ``group_placed``
(the node and the allocation time of each job), ``node_state`` (every change of the
scheduler's view: Slurm's own detection of a failed node), ``node_excluded`` and
``node_returned``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from monarch_ft.controller.placement import NodePool, node_suspicion
from monarch_ft.launcher.base import Launcher, RankProcess
from monarch_ft.records.events import EventKind


class NodeWatch:
    """Applies the placement rules to one launcher and event log.

    Args:
        launcher: the job's launcher (its nodes, their states, the exclusions it applies).
        emit: the event log's emit.
        probation_s: ``ft.node_probation_s``.
    """

    def __init__(self, launcher: Launcher, emit: Callable[..., Any], probation_s: float) -> None:
        self.launcher = launcher
        self.emit = emit
        self.pool = NodePool(probation_s)
        self.states: dict[str, str] = {}
        self.placements = 0

    def tick(self, now: float) -> None:
        """New placements and node states to the event log; nodes back in the pool released."""
        for placed in self.launcher.take_placements():
            self.placements += 1
            self.emit(EventKind.GROUP_PLACED, **placed)
        states = self.launcher.node_states()
        if states is self.states or not states:
            return
        for node, state in sorted(states.items()):
            previous = self.states.get(node)
            if state != previous:
                self.emit(EventKind.NODE_STATE, node=node, state=state, health=self.launcher.node_health(state), previous=previous)
        self.states = states
        returned = self.pool.observe({node: self.launcher.node_health(state) for node, state in states.items()}, now)
        for back in returned:
            self.emit(EventKind.NODE_RETURNED, node=back.node, reason=back.reason, excluded_s=back.excluded_s)
        if returned:
            self._apply()

    def group_failed(self, group: int, attempt: int, ranks: Sequence[RankProcess], now: float) -> None:
        """A group failed: exclude its node if the failure implicates it (before the group's
        ranks are stopped: their exits as they are now are the evidence)."""
        if not self.states or not ranks:
            return
        codes = [p.poll() for p in ranks]
        nodes = {p.launch.host for p in ranks} & set(self.states)
        for node in sorted(nodes):
            reason = node_suspicion(codes, self.launcher.node_health(self.states[node]))
            if reason is not None and self.pool.exclude(node, reason, now, group, attempt) is not None:
                self._apply()
                self.emit(EventKind.NODE_EXCLUDED, node=node, reason=reason, group=group, attempt=attempt, excluded=sorted(self.pool.excluded))

    def _apply(self) -> None:
        self.launcher.exclude_nodes(self.pool.to_exclude(self.states))

    def summary(self) -> dict:
        """For summary.json: every exclusion and return, the nodes excluded at the end."""
        return {**self.pool.summary(), "placements": self.placements}
