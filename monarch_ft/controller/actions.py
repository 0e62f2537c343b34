"""What a tick's decision asks the executor to do: typed actions, applied in order.

:func:`monarch_ft.controller.decide.decide` returns a list of these; :class:`monarch_ft.controller.act.Executor`
carries each out through the launcher, the pools and the run directory, and writes the events.
An action says everything its execution needs (which group, which attempt, how to start it and
what to do if a fork fails), so the executor decides nothing. The fast tests assert on them.

Events are actions too (:class:`Emit`): a decision's events are written in the order decided,
between the actions that act on the world (``group_failed`` before the ranks are stopped,
``group_stopped`` after).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from monarch_ft.controller.hangs import Hang
from monarch_ft.controller.planner import ColdStart, WarmFork
from monarch_ft.controller.state import RankState
from monarch_ft.controller.stragglers import ProbeReason
from monarch_ft.records.decisions import StateDecision
from monarch_ft.records.events import EventKind, JobStatus


@dataclass(frozen=True)
class Emit:
    """Write one event (``time``: the decision's own, when it has one; else the clock's at writing)."""

    kind: EventKind | str
    fields: dict[str, Any] = field(default_factory=dict)
    # A rank's own event relayed as it wrote it (a new controller relays it no second time:
    # controller.takeover.ResumedTail), not one the controller decided.
    relay: bool = False


@dataclass(frozen=True)
class WriteMetrics:
    """Append rank step records to ``metrics.jsonl``, as the ranks wrote them."""

    records: tuple[dict[str, Any], ...]
    lines: tuple[Optional[bytes], ...] = ()
    """Each record's line as written (None or absent: encoded from the record)."""


@dataclass(frozen=True)
class PrintError:
    """One ``monarch_ft: error:`` line on the console (stderr)."""

    message: str


@dataclass(frozen=True)
class FailGroup:
    """A group failed: capture its ranks' stacks first when ``stacks_tag`` is set (a hang), write
    ``group_failed`` with ``why`` (and the stacks), stop every one of ``ranks`` still running
    (SIGKILL), write ``group_stopped``. Its recovery is decided apart (the next actions, or the
    tick's next pass)."""

    group: int
    attempt: int
    why: dict[str, Any]
    stacks_tag: Optional[str] = None
    ranks: tuple[RankState, ...] = ()


@dataclass(frozen=True)
class StopGroup:
    """Stop a group's ranks still running, not failed (a full restart): SIGKILL, then
    ``group_stopped`` with ``reason``."""

    group: int
    attempt: int
    reason: str
    ranks: tuple[RankState, ...] = ()


@dataclass(frozen=True)
class ReportStall:
    """Every stepping group is silent at once: capture the stacks of ``groups`` and write ``job_stall``."""

    groups: tuple[int, ...]
    hangs: dict[int, Hang]
    escalate_after_s: float


@dataclass(frozen=True)
class LaunchGroup:
    """Start ``group``'s attempt ``attempt``: its rank specs written (the ``load_step`` it loads,
    from ``load_path``, the ``gate`` it waits at), its ranks forked from the host's fork server when ``warm``,
    else started through the launcher.

    Args:
        relaunch: how a relaunch comes up (written as ``recovery_path`` before ``group_launched``);
            None for a first launch (not a recovery).
        cold_because: a first launch started cold: why (``group_launched``'s ``cold_because``).
    The contingency is part of the action: a warm fork that fails starts the ranks cold, a
    relaunch's ``recovery_path`` then saying ``cold_start`` with the fork's error
    (:meth:`monarch_ft.controller.planner.RecoveryPlanner.fork_failed`).
    """

    group: int
    attempt: int
    warm: bool
    relaunch: Optional[Union[WarmFork, ColdStart]] = None
    cold_because: Optional[str] = None
    load_step: Optional[int] = None
    load_path: Optional[str] = None
    gate: str = ""


@dataclass(frozen=True)
class PromoteStandby:
    """Standby ``standby`` takes ``group``'s identity (attempt ``attempt``), its state as
    ``decision`` says: its promotion file written, its ranks now the group's."""

    standby: int
    group: int
    attempt: int
    decision: StateDecision
    # The standby itself (its ranks and slot), taken out of the pool by the decision.
    entry: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LaunchStandby:
    """Start standby ``number`` on host slot ``slot`` (forked where the host's server is ready)."""

    number: int
    slot: int


@dataclass(frozen=True)
class LoseStandby:
    """Standby ``number`` can no longer take over (``reason``): its ranks killed, ``standby_lost`` written."""

    number: int
    reason: str
    was_ready: bool
    rebuild: bool
    ranks: tuple[RankState, ...] = ()


@dataclass(frozen=True)
class StartForkServer:
    """Start the fork server for ``group``'s host (its ``n``-th on that host)."""

    group: int
    host: str
    n: int


@dataclass(frozen=True)
class CloseForkServer:
    """Close the fork server of ``host`` (it died: its exit was written as ``fork_server_lost``)."""

    host: str


@dataclass(frozen=True)
class WriteGate:
    """Write a launch gate's decision (where a relaunched group's state comes from)."""

    path: str
    decision: StateDecision


@dataclass(frozen=True)
class OpenStartGate:
    """Open the shared start gate: the groups waiting at it train."""

    path: str


@dataclass(frozen=True)
class SetHold:
    """The hold file: groups that finished keep serving quorums while it exists."""

    on: bool


@dataclass(frozen=True)
class WriteFloor:
    """Tell the ranks the job's committed step (control/commit_floor)."""

    step: int


@dataclass(frozen=True)
class WriteIntegrityEvery:
    """``ft.integrity_every=auto`` decided: fingerprint every ``every`` steps."""

    every: int


@dataclass(frozen=True)
class WriteTransportPeers:
    """Where each stepping group's ranks serve their state (a healing rank refetches from another)."""

    peers: dict[str, dict[str, str]]


@dataclass(frozen=True)
class Quarantine:
    """Move ``path`` (group ``group``'s copy of ``step``, found damaged by ``by``) aside and write
    ``checkpoint_quarantined``; a copy not there (or no ``path``) is recorded all the same (it is
    never chosen again), unless ``only_if_present`` (a scrub's finding gone since)."""

    group: int
    step: int
    problem: str
    by: str
    path: Optional[str] = None
    only_if_present: bool = False


@dataclass(frozen=True)
class QuarantineNewer:
    """Set aside group ``group``'s complete checkpoints newer than ``step`` (they may hold corrupt state)."""

    group: int
    step: int
    why: str


@dataclass(frozen=True)
class SetNodeExclusions:
    """Keep every allocation from now on off ``nodes`` (the launcher's exclusion list)."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class ReplanPending:
    """Give pending allocation ``job_id`` the nodes to keep off now (the scheduler's own command)."""

    job_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RestartLighthouse:
    """The Lighthouse died: its epoch moves on (written for the ranks) and it starts again on the same address."""

    epoch: int


@dataclass(frozen=True)
class StartProbe:
    """Time each rank's link (a probe round, in the prober's own thread)."""

    targets: dict[tuple[int, int], str]
    reason: ProbeReason
    step: int


@dataclass(frozen=True)
class RequestFinish:
    """Every group finishes at ``step`` or at the earlier step already asked for (``finish_requested``)."""

    step: int
    reason: str


@dataclass(frozen=True)
class FindDisk:
    """Find the newest intact checkpoint no newer than ``at_most`` (verify, quarantine the damaged,
    copy it where missing), after this tick's other actions: a decision waiting for it is taken
    at the next tick."""

    at_most: Optional[int]


@dataclass(frozen=True)
class RefuseDetach:
    """A detach asked for where no controller could take the job over: refused (the request is cleared)."""


@dataclass(frozen=True)
class EndJob:
    """The job ends with ``status``; the controller exits with ``code``."""

    status: JobStatus
    code: int
    # The controller ends before the tick's hooks and its save (a signal, a lost state, a detach).
    immediate: bool = False


Action = Union[
    Emit,
    WriteMetrics,
    PrintError,
    FailGroup,
    StopGroup,
    ReportStall,
    LaunchGroup,
    PromoteStandby,
    LaunchStandby,
    LoseStandby,
    StartForkServer,
    CloseForkServer,
    WriteGate,
    OpenStartGate,
    SetHold,
    WriteFloor,
    WriteIntegrityEvery,
    WriteTransportPeers,
    Quarantine,
    QuarantineNewer,
    SetNodeExclusions,
    ReplanPending,
    RestartLighthouse,
    StartProbe,
    RequestFinish,
    FindDisk,
    RefuseDetach,
    EndJob,
]
