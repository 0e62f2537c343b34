"""Pure recovery decisions: where a relaunched group's state comes from, and what is a hang.

Kept apart from the supervisor's watch loop (which only applies them) so each rule is
unit-tested in milliseconds against plain values (tests/test_recovery.py).

The rule behind :func:`decide_state_source`: **the job's committed step never goes
back.** A relaunched group heals from a live peer when one holds the job's state; with
no live peer the job's state is on disk, so it loads the newest complete checkpoint
(any group's, see ``align_latest_checkpoint``); with no checkpoint either, the job
has lost its state and must stop, never silently train again from its initial weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from monarch_ft.events import StrEnum
from typing import Optional, Sequence


class StateSource(StrEnum):
    """Where a group's training state comes from when it (re)joins the job."""

    INIT = "init"  # its initial weights: only while the job has committed nothing
    PEER = "peer"  # healed by TorchFT from a live group in the quorum
    DISK = "disk"  # the newest complete disk checkpoint


@dataclass(frozen=True)
class StateDecision:
    source: StateSource
    # DISK: the checkpoint step to load. PEER/INIT: None.
    step: Optional[int] = None
    # Committed steps the job gives up by going back to ``step`` (DISK only).
    steps_lost: int = 0


class JobStateLost(Exception):
    """Every group holding the job's state is gone and no checkpoint exists."""


def decide_state_source(live_peers: Sequence[int], job_step: int, checkpoint_step: Optional[int]) -> StateDecision:
    """Where a group that is ready to join gets its state.

    Args:
        live_peers: groups stepping in the job right now (they hold its committed state).
        job_step: steps the job has committed (the Manager's step after the newest commit),
            or the step it resumed from; 0 when nothing was committed yet.
        checkpoint_step: the newest complete checkpoint step of any group not after
            ``job_step`` (an older job's checkpoints in the same folder are not this job's
            state), None if none.

    Raises:
        JobStateLost: no live peer, steps committed, and no checkpoint to resume from.
    """
    if live_peers:
        return StateDecision(StateSource.PEER)
    if job_step == 0:
        return StateDecision(StateSource.INIT)
    if checkpoint_step is not None:
        if checkpoint_step > job_step:
            raise ValueError(f"checkpoint step {checkpoint_step} is ahead of the job's step {job_step}: not this job's")
        return StateDecision(StateSource.DISK, checkpoint_step, job_step - checkpoint_step)
    raise JobStateLost(
        f"every replica group holding the job's state was lost at step {job_step} and there is no complete "
        "disk checkpoint to resume from; enable checkpoint.enable=true with a checkpoint.interval below the "
        "steps a job may lose, then resume with checkpoint.resume=true"
    )


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

    def __init__(self) -> None:
        self.job_step = 0  # the Manager's step after the newest commit (steps committed)
        self._newest: dict[int, int] = {}  # quorum id -> newest step committed in it

    def record(self, step: int, quorum_id: int) -> Optional[int]:
        """Take a commit of ``step`` in quorum ``quorum_id``; returns the higher step an
        earlier quorum committed (a regression), or None."""
        self.job_step = max(self.job_step, step + 1)
        self._newest[quorum_id] = max(step, self._newest.get(quorum_id, step))
        earlier = max((s for q, s in self._newest.items() if q < quorum_id), default=-1)
        return earlier if earlier > step else None

    def rollback(self, step: int) -> None:
        """The job explicitly went back to a checkpoint at ``step`` (its state was lost)."""
        self.job_step = step
        self._newest.clear()


class OsState(StrEnum):
    """psutil's process states that matter to hang blame."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    DISK_SLEEP = "disk-sleep"
    STOPPED = "stopped"
    TRACING_STOP = "tracing-stop"
    ZOMBIE = "zombie"
    DEAD = "dead"
    GONE = "gone"


# A rank in one of these states is stuck by itself (SIGSTOP, dead); a rank merely sleeping
# may be waiting on a peer in a collective. Not disk-sleep: a rank passes through it on any
# file write, so one sample of it explains nothing (a CI run failed a stall's only group on
# such a sample); telling a rank stuck in I/O needs the state held for a while.
SELF_EXPLAINED = {OsState.STOPPED.value, OsState.TRACING_STOP.value, OsState.ZOMBIE.value, OsState.DEAD.value}


class Phase(StrEnum):
    """What a rank's main thread is doing; its liveness thread reports it every second.

    The hang detector judges a rank by its phase: a long save, a wait for a quorum while
    a peer heals or saves, are not hangs within their own budgets (see HangLimits).
    """

    STARTUP = "startup"  # building the model, loading state
    GATE = "gate"  # waiting at a start or launch gate
    COMPUTE = "compute"  # forward, backward, optimizer step
    SYNC = "sync"  # TorchFT: quorum, cross-group allreduce, should_commit (bounded by its timeouts)
    SAVE = "save"  # a checkpoint save (bounded by its own watchdog)
    HOLD = "hold"  # finished, serving quorums while another group has work
    STANDBY = "standby"  # a warm standby waiting for its promotion (never a replica group's phase)


@dataclass(frozen=True)
class RankView:
    """What the supervisor knows of one live rank at a tick."""

    rank: int
    silent_s: float  # since its last record of any kind (a step, an event, a liveness beat)
    started: bool  # it has stepped (or finished): startup limits no longer apply
    phase: Optional[str] = None  # its last reported Phase
    phase_s: float = 0.0  # how long it has been in that phase
    os_state: Optional[str] = None


@dataclass(frozen=True)
class HangLimits:
    """How long each thing may take before a rank counts as hung.

    Args:
        hang_timeout_s: a rank that reports nothing at all (its liveness thread cannot run:
            stopped, or the GIL held) for this long is hung; so is one computing this long.
        startup_timeout_s: the same for a rank that has not stepped yet (imports, model build).
        save_timeout_s: the rank-side save watchdog's bound; a save gets this plus a margin.
        sync_budget_s: TorchFT's own bound on a quorum plus a collective and a commit
            (quorum_timeout + 2 x timeout): a rank waiting in TorchFT for a slow peer is not
            hung before TorchFT itself gives up.
    """

    hang_timeout_s: float
    startup_timeout_s: float
    save_timeout_s: float
    sync_budget_s: float

    def silent_limit(self, r: RankView) -> float:
        return self.hang_timeout_s if r.started else self.startup_timeout_s

    def phase_budget(self, phase: Optional[str]) -> float:
        if phase == Phase.COMPUTE.value:
            return self.hang_timeout_s
        if phase == Phase.SYNC.value:
            return self.sync_budget_s + self.hang_timeout_s
        if phase == Phase.SAVE.value:
            return self.save_timeout_s + self.hang_timeout_s / 2
        if phase == Phase.STARTUP.value:
            return self.startup_timeout_s
        return float("inf")  # gate, hold: the supervisor itself releases them

    def overdue(self, r: RankView) -> bool:
        return r.silent_s > self.silent_limit(r) or r.phase_s > self.phase_budget(r.phase)


@dataclass(frozen=True)
class Hang:
    rank: int
    silent_s: float
    os_state: Optional[str]
    # The culprit's state explains the silence (stopped, zombie, ...), not a wait on a peer.
    self_explained: bool
    phase: Optional[str]
    phase_s: float


def find_hang(ranks: Sequence[RankView], limits: HangLimits) -> Optional[Hang]:
    """The rank to blame when some rank of a group is past its limit, else None.

    One stuck rank soon stalls its group peers too (they wait in its collectives, inside
    their own budgets): blame a rank whose OS state explains it, then one past its limit
    by silence (its liveness thread is frozen too), then the one longest in its phase.
    """
    overdue = [r for r in ranks if limits.overdue(r)]
    if not overdue:
        return None
    culprit = min(overdue, key=lambda r: (r.os_state not in SELF_EXPLAINED, r.silent_s <= limits.silent_limit(r), -r.phase_s))
    return Hang(
        rank=culprit.rank,
        silent_s=round(culprit.silent_s, 2),
        os_state=culprit.os_state,
        self_explained=culprit.os_state in SELF_EXPLAINED,
        phase=culprit.phase,
        phase_s=round(culprit.phase_s, 2),
    )


def is_job_stall(hung: dict[int, Hang], stepping: Sequence[int]) -> bool:
    """Every group that was stepping looks hung and none is stuck by itself.

    That is one job-wide stall (a shared cause: CPU starvation, a shared service, a
    collective across groups), not N rank faults: killing them all would leave the job
    with no group holding its state, by the detector's own hand.

    Args:
        hung: this tick's hang verdicts, by group.
        stepping: groups that were stepping in the job (running, not given up).
    """
    if not hung or not stepping:
        return False
    if any(h.self_explained for h in hung.values()):
        return False
    return all(g in hung for g in stepping)
