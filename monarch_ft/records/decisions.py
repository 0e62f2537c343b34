"""The controller's decisions a rank acts on: where a (re)joining group's state comes from,
and what a promoted warm standby becomes.

The rule behind :func:`decide_state_source`: **the job's committed step never goes
back.** A relaunched group heals from a live peer when one holds the job's state; with
no live peer the job's state is on disk, so it loads the newest intact checkpoint
(any group's, verified against its manifest, see
``monarch_ft.controller.checkpoints.recover_checkpoint``); with no checkpoint either, the
job has lost its state and must stop, never silently train again from its initial weights.

The controller decides (``monarch_ft.controller``) and writes the decision, one
:class:`StateDecision` in one shape (:meth:`StateDecision.to_record`), into a group's launch
gate or inside a standby's :class:`Promotion`; the rank reads that one type back
(:meth:`StateDecision.from_record`). Both import it from here, so the two sides cannot
disagree on its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from monarch_ft.records.events import StrEnum


class StateSource(StrEnum):
    """Where a group's training state comes from when it (re)joins the job."""

    INIT = "init"  # its initial weights: only while the job has committed nothing
    PEER = "peer"  # healed by TorchFT from a live group in the quorum
    DISK = "disk"  # the newest complete disk checkpoint


@dataclass(frozen=True)
class StateDecision:
    """Where a relaunched or promoted group's state comes from, as the rank receives it."""

    source: StateSource
    # DISK: the checkpoint step to load. PEER/INIT: None.
    step: Optional[int] = None
    # Committed steps the job gives up by going back to ``step`` (DISK only).
    steps_lost: int = 0
    # DISK: the step directory this group loads (its own folder's copy, or an intact one
    # elsewhere where a copy could not be made); None: its own folder's.
    path: Optional[str] = None

    def at(self, path: Optional[str]) -> "StateDecision":
        """This decision, loading the copy at ``path`` (DISK)."""
        return replace(self, path=path)

    def to_record(self) -> dict[str, Any]:
        """The one shape it has on disk: a launch gate's content, a promotion's ``decision``."""
        return {"source": self.source.value, "step": self.step, "steps_lost": self.steps_lost, "path": self.path}

    @classmethod
    def from_record(cls, record: Optional[dict]) -> Optional["StateDecision"]:
        """Read :meth:`to_record`'s shape back; None for no decision (an empty shared start
        gate: the group loaded what its spec named before it got there)."""
        if not record:
            return None
        return cls(StateSource(record["source"]), record.get("step"), int(record.get("steps_lost") or 0), record.get("path"))


class JobStateLost(Exception):
    """Every group holding the job's state is gone and no checkpoint exists."""


def needs_disk(live_peers: Sequence[int], job_step: int) -> bool:
    """Whether :func:`decide_state_source` needs the checkpoint step: no live peer, and steps
    committed. Finding an intact checkpoint reads every byte of it, so it is done only then."""
    return not live_peers and job_step > 0


def decide_state_source(live_peers: Sequence[int], job_step: int, checkpoint_step: Optional[int], tried: Sequence[str] = ()) -> StateDecision:
    """Where a group that is ready to join gets its state.

    Args:
        live_peers: groups stepping in the job right now (they hold its committed state).
        job_step: steps the job has committed (the Manager's step after the newest commit),
            or the step it resumed from; 0 when nothing was committed yet.
        checkpoint_step: the newest intact checkpoint step of any group not after
            ``job_step`` (an older job's checkpoints in the same folder are not this job's
            state), None if none.
        tried: the checkpoint steps that were found damaged or failed to load, each as
            ``step N (why)``: with none left, the stop names each.

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
    if tried:
        raise JobStateLost(
            f"every replica group holding the job's state was lost at step {job_step} and no intact disk checkpoint "
            f"is left: {'; '.join(tried)}; each was moved to its group folder's quarantine/ (nothing deleted; "
            "python -m monarch_ft verify RUN_DIR checks what is on disk)"
        )
    raise JobStateLost(
        f"every replica group holding the job's state was lost at step {job_step} and there is no complete "
        "disk checkpoint to resume from; enable checkpoint.enable=true with a checkpoint.interval below the "
        "steps a job may lose, then resume with checkpoint.resume=true"
    )


# ---------------------------------------------------------------- promotion
@dataclass
class Promotion:
    """What a promoted standby becomes (the promotion file's content).

    Args:
        standby: the standby's number.
        group: the failed group's index it takes; replica_id is TorchFT's ``group_<g>``.
        attempt: the group's new attempt (its report files are named by it).
        ranks: per rank (str index): report_path, spec_path, scratch_dir.
        checkpoint_dir: the group's checkpoint folder.
        decision: where its state comes from, what a relaunched group's launch gate carries.
        promoted_at: the supervisor's wall-clock time of the promotion.
    """

    standby: int
    group: int
    replica_id: str
    attempt: int
    ranks: dict
    checkpoint_dir: str
    decision: StateDecision = field(default_factory=lambda: StateDecision(StateSource.INIT))
    promoted_at: float = 0.0

    def to_record(self) -> dict[str, Any]:
        """The promotion file's content."""
        return {**{k: v for k, v in vars(self).items() if k != "decision"}, "decision": self.decision.to_record()}

    @classmethod
    def from_record(cls, record: dict) -> "Promotion":
        return cls(**{**record, "decision": StateDecision.from_record(record.get("decision")) or StateDecision(StateSource.INIT)})
