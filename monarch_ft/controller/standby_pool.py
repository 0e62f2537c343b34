"""Warm standby groups: ranks built ahead of a fault that take a failed group's place.

Most of a cold restart's MTTR is a new rank starting: a Python interpreter, importing
torch/TorchTitan/TorchFT, building and sharding the model. A standby group (``ft.standby_groups``,
M ranks like any group) does all of that once, early, and then waits: its own store and
in-group process group, the model built and sharded, optimizer state materialised, data
opened, the cross-group process group and checkpoint transport ready. What it must NOT do
before it is promoted is construct the TorchFT Manager: a Manager heartbeats the
Lighthouse from construction on, and a heartbeating replica that never asks for a
quorum holds every quorum up to the join timeout (and counts against the split-brain
rule of torchft's ``quorum_compute``). So the Manager and everything tied to a group's
identity (report files, scratch, checkpoint folder, data shard, fault agent) is built
on promotion (``monarch_ft.rank.trainer.Trainer._bind``).

The controller promotes a ready standby when a group fails (exit, hang verdict, node
fault): it writes one promotion file (RunLayout.promotion, atomically) that carries the
identity the standby takes and where the group's state comes from, decided exactly as a
relaunched group's launch gate decides it (``records.decisions.decide_state_source``: a live peer,
else the newest disk checkpoint, else the job's state is lost). Then it builds a
replacement standby in the background at a lower CPU priority than the training ranks.
With no standby ready (two faults close together) the cold path runs.

This module holds the controller's side: the pure decisions (unit-tested in
tests/unit/test_standby.py) and the pool's bookkeeping. The waiting rank's side is
:mod:`monarch_ft.rank.standby_wait`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from monarch_ft.controller.snapshot import own
from monarch_ft.records.decisions import Promotion, StateDecision
from monarch_ft.records.events import RecoveryPath, StandbyStatus

# Niceness of a standby while it builds and waits: below the training ranks (0), so a
# standby being (re)built in the background does not slow the job it protects.
STANDBY_NICENESS = 10
# OS states (psutil) in which a standby cannot take over: it is not promoted, it is replaced.
DEAD_STATES = ("stopped", "zombie", "dead", "gone", "tracing-stop")


# ---------------------------------------------------------------- pure decisions
def resolve_standby_groups(configured: Optional[int], launcher_default: int, recovery: str) -> int:
    """How many standby groups the job keeps.

    Args:
        configured: ``ft.standby_groups`` (None: the launcher's default).
        launcher_default: the launcher's ``LauncherTraits.default_standby_groups``: 1 where a
            standby costs only local processes, 0 where it holds a real allocation (its own
            Slurm job or Monarch proc mesh: K > 0 is then the user's explicit choice).
        recovery: ``ft.recovery``; ``full_restart`` (the baseline) uses none.
    """
    if recovery == "full_restart":
        return 0
    if configured is None:
        return launcher_default
    return configured


# Standbys lost in a row while still building (a crash at start-up, not a fault while
# waiting) after which the job stops building them: a build that always fails would
# otherwise start processes on every watch tick.
MAX_FAILED_BUILDS = 3


def standbys_to_launch(wanted: int, alive: int, training_started: bool, job_finishing: bool, failed_builds: int = 0) -> int:
    """How many standbys to start now: none before the training groups are up (a standby
    must not slow the job's first start), once every group is done, or after
    MAX_FAILED_BUILDS builds in a row failed; else the shortfall."""
    if not training_started or job_finishing or failed_builds >= MAX_FAILED_BUILDS:
        return 0
    return max(0, wanted - alive)


def standby_loss(exit_codes: Sequence[Optional[int]], os_states: Sequence[Optional[str]] = ()) -> Optional[str]:
    """Why a standby can no longer take over (a rank exited, or is stopped or a zombie), or None.

    Args:
        exit_codes: each rank's exit code, None while it runs.
        os_states: each rank's psutil state where known (checked before a promotion).
    """
    for rank, code in enumerate(exit_codes):
        if code is not None:
            return f"rank {rank} exited ({code})"
    for rank, state in enumerate(os_states):
        if state in DEAD_STATES:
            return f"rank {rank} is {state}"
    return None


def recovery_path(recovery: str, standby_ready: bool) -> RecoveryPath:
    """How a failed group comes back: a ready standby takes its place (live recovery only),
    else its ranks start cold."""
    if recovery != "full_restart" and standby_ready:
        return RecoveryPath.STANDBY
    return RecoveryPath.COLD_START


@dataclass
class UnreadyClock:
    """Seconds the job ran without a ready standby (counted from when it first wanted one).

    Part of the job's state: a controller taking the job over goes on counting.

    Args:
        wanted: standby groups configured (0: the clock never runs).
    """

    wanted: int = 0
    total: float = 0.0
    spells: int = 0  # times the job went from covered to uncovered
    since: Optional[float] = None  # when the current spell began (None: covered)

    def update(self, now: float, ready: int, counting: bool) -> None:
        """``ready``: standbys ready now; ``counting``: the job is training (wants cover)."""
        uncovered = counting and self.wanted > 0 and ready == 0
        if uncovered and self.since is None:
            self.since = now
            self.spells += 1
        elif not uncovered and self.since is not None:
            self.total += now - self.since
            self.since = None

    def seconds(self, now: float) -> float:
        return self.total + (now - self.since if self.since is not None else 0.0)


# ---------------------------------------------------------------- promotion


def build_promotion(layout: Any, standby: int, group: int, attempt: int, ranks: int, decision: StateDecision, now: float) -> Promotion:
    return Promotion(
        standby=standby,
        group=group,
        replica_id=f"group_{group}",
        attempt=attempt,
        ranks={
            str(r): {"report_path": layout.report(group, r, attempt), "spec_path": layout.spec(group, r, attempt), "scratch_dir": layout.scratch(group, r)}
            for r in range(ranks)
        },
        checkpoint_dir=layout.checkpoint(group),
        decision=decision,
        promoted_at=now,
    )


# ---------------------------------------------------------------- the pool
@dataclass
class Standby:
    """One standby group in the pool.

    Args:
        number: its number (one per standby ever launched; names its files).
        slot: the host/device slot it was placed on (a simulated host of its own).
        ranks: its ranks' supervisor-side states (controller.state.RankState), filled in by the
            executor when it starts them.
        launched_at: when it was launched.
    """

    number: int
    slot: int
    ranks: list
    launched_at: float
    status: StandbyStatus = StandbyStatus.BUILDING
    ready_at: Optional[float] = None
    ready_ranks: set = field(default_factory=set)


@dataclass
class StandbyPoolState:
    """The job's standbys. The live ones die with their controller (a controller that attaches
    builds its own: ``standbys`` and the numbering are its own); the counts ``summary.json``
    reports, builds lost in a row and the clock of time without a ready one are the job's
    (:class:`monarch_ft.controller.state.JobState`), so they cover the whole job.

    Its decisions are :mod:`monarch_ft.controller.decide.pools`; starting and stopping its ranks,
    :mod:`monarch_ft.controller.act`."""

    launched: int = 0
    promoted: int = 0
    lost: int = 0
    failed_builds: int = 0  # lost while building, in a row (see MAX_FAILED_BUILDS)
    ready_s: list[float] = field(default_factory=list)  # launch -> ready, per standby
    clock: UnreadyClock = field(default_factory=UnreadyClock)
    # ---- this controller's own
    # Standby groups to keep (resolve_standby_groups).
    wanted: int = own(0)
    # The live standbys, oldest first.
    standbys: list[Standby] = own(default_factory=list)
    # The first host/device slot a standby may use (after the groups'), the first number this
    # controller gives (RunLayout.next_standby_number: after its predecessors'), and how many it
    # launched (numbers and slots follow from it).
    first_slot: int = own(0)
    first_number: int = own(0)
    launched_here: int = own(0)

    def ready(self) -> list[Standby]:
        return [s for s in self.standbys if s.status == StandbyStatus.READY]

    def ready_numbers(self) -> list[int]:
        """The ready standbys' numbers, the longest ready first (the one a promotion takes)."""
        return [s.number for s in sorted(self.ready(), key=lambda s: s.ready_at or 0.0)]

    def find(self, number: int) -> Optional[Standby]:
        return next((s for s in self.standbys if s.number == number), None)

    def summary(self, now: float) -> dict:
        return {
            "standby_groups": self.wanted,
            "launched": self.launched,
            "promoted": self.promoted,
            "lost": self.lost,
            "build_s": [round(s, 2) for s in self.ready_s],
            # How long the job trained with no ready standby (first build, rebuilds after a promotion or a loss).
            "seconds_without_ready_standby": round(self.clock.seconds(now), 3),
            "spells_without_ready_standby": self.clock.spells,
        }
