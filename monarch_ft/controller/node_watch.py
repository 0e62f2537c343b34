"""The controller's watch of a cluster's nodes: where each job went, what the scheduler sees,
and which nodes new allocations are kept off (:mod:`monarch_ft.controller.placement` decides
what a node's state means; the :class:`~monarch_ft.controller.planner.RecoveryPlanner` decides
an exclusion as part of a failure's action, which :mod:`monarch_ft.controller.recovery` applies
through :meth:`NodeWatch.exclude`).

The loop calls :meth:`NodeWatch.tick` once per tick, before any launch; the recovery calls
:meth:`NodeWatch.suspects` when a group fails, before its ranks are stopped (their exits as
they are then are the evidence). Both do nothing for a launcher without nodes (local
processes, Monarch), whose ``node_states`` is empty. Everything it learns goes to the event
log: ``group_placed`` (the node and the allocation time of each job), ``node_state`` (every
change of the scheduler's view: Slurm's own detection of a failed node), ``node_excluded`` and
``node_returned``. What it holds is the job's state (``JobState.nodes``): a controller that
takes the job over keeps the exclusions and applies them again (:meth:`NodeWatch.resume`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from monarch_ft.controller.placement import NodePool, Suspect, node_suspicion
from monarch_ft.launcher.base import Launcher, RankProcess
from monarch_ft.records.events import EventKind


class NodeWatch:
    """Applies the placement rules to one launcher and event log.

    Args:
        launcher: the job's launcher (its nodes, their states, the exclusions it applies).
        emit: the event log's emit.
        pool: the job's state of its nodes (``JobState.nodes``).
    """

    def __init__(self, launcher: Launcher, emit: Callable[..., Any], pool: NodePool) -> None:
        self.launcher = launcher
        self.emit = emit
        self.pool = pool

    def resume(self) -> None:
        """A controller that took the job over keeps the launcher off the nodes still excluded."""
        if self.pool.excluded:
            self._apply()

    def tick(self, now: float) -> None:
        """New placements and node states to the event log; nodes back in the pool released."""
        pool = self.pool
        for placed in self.launcher.take_placements():
            pool.placements += 1
            self.emit(EventKind.GROUP_PLACED, **placed)
        states = self.launcher.node_states()
        if not states:
            return
        if states != pool.states:
            for node, state in sorted(states.items()):
                previous = pool.states.get(node)
                if state != previous:
                    self.emit(EventKind.NODE_STATE, node=node, state=state, health=self.launcher.node_health(state), previous=previous)
            pool.states = dict(states)
        if not pool.excluded:
            return
        # Every tick while a node is out: a probation ends with no change of state.
        returned = pool.observe({node: self.launcher.node_health(state) for node, state in states.items()}, now)
        for back in returned:
            self.emit(EventKind.NODE_RETURNED, node=back.node, reason=back.reason, excluded_s=back.excluded_s)
        if returned:
            self._apply()

    def suspects(self, ranks: Sequence[RankProcess]) -> tuple[Suspect, ...]:
        """The nodes a failed group's ranks (still as they failed) implicate (placement.node_suspicion)."""
        if not self.pool.states or not ranks:
            return ()
        codes = [p.poll() for p in ranks]
        out = []
        for node in sorted({p.launch.host for p in ranks} & set(self.pool.states)):
            reason = node_suspicion(codes, self.launcher.node_health(self.pool.states[node]))
            if reason is not None:
                out.append(Suspect(node, reason))
        return tuple(out)

    def nodes_of(self, ranks: Sequence[RankProcess]) -> list[str]:
        """The scheduler's nodes ``ranks`` run on ([] for a launcher without nodes)."""
        return sorted({p.launch.host for p in ranks} & set(self.pool.states))

    def exclude(self, suspects: Sequence[Suspect], group: int, attempt: int, now: float, keep_off: Sequence[str]) -> None:
        """Carry out an action's exclusion: record each suspect (``node_excluded``) and keep every
        allocation from now on off ``keep_off`` (the action's ``exclude``)."""
        for s in suspects:
            if self.pool.exclude(s.node, s.reason, now, group, attempt) is not None:
                self.emit(EventKind.NODE_EXCLUDED, node=s.node, reason=s.reason, group=group, attempt=attempt, excluded=sorted(self.pool.excluded))
        if suspects:
            self.launcher.exclude_nodes(set(keep_off))

    def _apply(self) -> None:
        self.launcher.exclude_nodes(self.pool.to_exclude(self.pool.states))
