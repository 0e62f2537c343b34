"""What every part of a tick's decision shares: its inputs (:class:`Rules`, :class:`Facts`,
the observations) and its output (:class:`Decision`, the actions in order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from monarch_ft.config.job import JobConfig
from monarch_ft.controller.actions import Action, Emit, FindDisk, PrintError, WriteMetrics
from monarch_ft.controller.integrity import IntegrityJudge, Verdict
from monarch_ft.controller.observe import Observations
from monarch_ft.controller.planner import DiskFact, RecoveryPlanner
from monarch_ft.controller.state import JobState
from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.report_records import StepRecord


@dataclass(frozen=True)
class Rules:
    """What the decisions apply, fixed for the job: its config, the recovery planner, the run
    directory's paths (names only: nothing is read), the integrity judge (its state is the job's),
    and what the launcher and the pools are (their names and limits, not their handles).

    Args:
        cfg: the job's config.
        planner: the recovery planner (pure).
        layout: the run directory's paths.
        judge: the integrity checks (their state is ``JobState.integrity``).
        launcher_name: the launcher's name (``group_launched``).
        fork_problem: why this launcher's ranks are never forked (None: they may be).
        forks_enabled: warm fork servers run (``ft.warm_fork``, not the full-restart baseline).
        compute_on_cpu: the ranks compute on the CPU (the hang model's asleep rule).
        hang_timeout_fixed: ``ft.hang_timeout_s`` as a number (None: learned).
        node_health: what a scheduler's node state says of the node (launchers with nodes).
        adoption_problem: why no controller could take this job over (a detach is then refused).
    """

    cfg: JobConfig
    planner: RecoveryPlanner
    layout: RunLayout
    judge: IntegrityJudge
    launcher_name: str
    fork_problem: Optional[str]
    forks_enabled: bool
    compute_on_cpu: bool
    hang_timeout_fixed: Optional[float]
    node_health: Callable[[str], Any]
    adoption_problem: Optional[str] = None


@dataclass
class Facts:
    """What some decisions need beyond the job's state and the observations, found by the
    executor when a decision asks (:class:`~monarch_ft.controller.actions.FindDisk`), then handed
    to the tick's next pass: the newest intact checkpoint no newer than a step, by that step."""

    disk: dict[Optional[int], DiskFact] = field(default_factory=dict)


class Decision:
    """The actions one pass decided, in order."""

    def __init__(self) -> None:
        self._actions: list[Action] = []
        self._disk: set[Optional[int]] = set()
        # Step records relayed since the last other action: one WriteMetrics once another
        # action comes (or the actions are read).
        self._steps: list[StepRecord] = []

    @property
    def actions(self) -> list[Action]:
        self._flush()
        return self._actions

    def _flush(self) -> None:
        if self._steps:
            steps, self._steps = self._steps, []
            self._actions.append(WriteMetrics(tuple(s.raw for s in steps), tuple(s.line for s in steps)))

    def do(self, action: Action) -> None:
        self._flush()
        self._actions.append(action)

    def relay_steps(self, steps: Iterable[StepRecord]) -> None:
        """Step records to ``metrics.jsonl``, after every action decided before them. Relays with
        no other action between them are one :class:`WriteMetrics`: one write to the file a
        tick, where a write per group was a thousand writes (each line-buffered: a system call)
        a tick at 1,024 groups. An event still follows the steps before it (the steps a rank
        wrote before an event are in the metrics when the event is)."""
        self._steps.extend(steps)

    def emit(self, _kind: EventKind | str, **fields: Any) -> dict[str, Any]:
        """An event, written in its place among the actions; returns its fields."""
        self.do(Emit(_kind, fields))
        return fields

    def relay(self, _kind: EventKind | str, **fields: Any) -> dict[str, Any]:
        """A rank's own event, relayed to the event log (:attr:`Emit.relay`); returns its fields."""
        self.do(Emit(_kind, fields, relay=True))
        return fields

    def error(self, message: str) -> None:
        self.do(PrintError(message))

    def find_disk(self, at_most: Optional[int]) -> None:
        """A decision waits for the newest intact checkpoint no newer than ``at_most``."""
        if at_most not in self._disk:
            self._disk.add(at_most)
            self.do(FindDisk(at_most))

    @property
    def waiting(self) -> bool:
        """Some decision waits for a fact the executor finds (the tick's next pass takes it)."""
        return bool(self._disk)


@dataclass
class Tick:
    """One pass of a tick's decision: what it reads and what it writes.

    Args:
        rules: the job's rules.
        state: the job's state (the decision updates it; it does no I/O).
        obs: what the tick observed (an empty one for a pass that only takes new facts).
        facts: facts found for this pass.
        out: the actions decided.
    """

    rules: Rules
    state: JobState
    obs: Observations
    facts: Facts
    out: Decision
    # Integrity verdicts the reports completed, acted on after the failures.
    verdicts: list[Verdict] = field(default_factory=list)
    # Some step record was taken this pass (what the step-time judgements are worked out from).
    steps_seen: bool = False

    @property
    def now(self) -> float:
        return self.obs.now

    @property
    def cfg(self) -> JobConfig:
        return self.rules.cfg
