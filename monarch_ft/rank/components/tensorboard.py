"""TensorBoard event files of a replica group: its training curves, with every fault marked.

``metrics.tensorboard=true``: each group's rank 0 writes one TensorBoard run,
``<run>/tensorboard/group_<g>/`` (RunLayout.tensorboard), from the same records it appends
to its report file (a :class:`~monarch_ft.rank.components.metrics.MetricSink` of its
RankReporter), so the trainer reports once and nothing is measured twice. Rank 0 speaks
for its group, as its records in ``metrics.jsonl`` do for the drills: the group's ranks
train one model (FSDP shards) on the same steps. Each launch attempt of the group adds its
own event file to the group's run, so a restarted group's curve continues where it rejoined.

Curves (x: the training step): ``train/loss``, ``train/lr``, ``train/tokens_per_s``,
``train/step_time_s``, ``ft/compute_s`` (the group's own compute: a straggler's curve stands
above its peers' runs; an evicted one's next attempt is marked with the reason, ``straggler``),
``ft/quorum_size``, ``ft/participating_groups``, and where the mode reports them
``ft/quorum_s`` and ``ft/xgroup_s``.

Faults are marked because a curve alone does not say why it bends. TensorBoard has no
annotation layer, so a marker is written twice at its step: a scalar ``faults/<kind>``
of 1 (a point on the Scalars dashboard, one chart per :class:`Marker`) and a line in the
text tag ``faults`` (the Text dashboard: what happened, step by step). A fault in another
group shows in this group's run as a quorum change (the group left, later rejoined); in the
failed group's own run as the restart of its next attempt, with the supervisor's reason.
"""

from __future__ import annotations

from typing import Any, Optional

from monarch_ft.records.events import EventKind, StrEnum
from monarch_ft.records.layout import RunLayout, read_jsonl
from monarch_ft.records.members import members_of


class Marker(StrEnum):
    """What a fault marker says happened at its step."""

    RESTART = "restart"  # this group was relaunched (a new attempt); the text says why
    HEAL = "heal"  # the group received the live weights from a peer group (TorchFT recovery)
    CHECKPOINT_LOADED = "checkpoint_loaded"  # state loaded from disk (resume, full restart, rollback)
    QUORUM_CHANGE = "quorum_change"  # groups left the quorum (a fault elsewhere) or rejoined it
    COMMIT_FAILED = "commit_failed"  # a sync TorchFT did not commit (a peer lost mid-step, a collective fault)
    FAULT = "fault"  # a fault this rank hit or was told to inject


# Step record field -> TensorBoard tag.
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "tokens_per_s": "train/tokens_per_s",
    "step_time_s": "train/step_time_s",
    "compute_s": "ft/compute_s",
    "quorum_size": "ft/quorum_size",
    "quorum_s": "ft/quorum_s",
    "xgroup_s": "ft/xgroup_s",
}
# Rank events that are faults this rank saw (its own report names them).
FAULT_EVENTS = (
    EventKind.COLLECTIVE_FAULT_INJECTED,
    EventKind.SLOW_SAVE_INJECTED,
    EventKind.COMMIT_REFUSED,
    EventKind.CHECKPOINT_SAVE_TIMEOUT,
    EventKind.RECOVERY_FAILED,
)
# Why a group was relaunched: the supervisor's last word on it before this attempt.
_RESTART_CAUSES = (EventKind.GROUP_FAILED, EventKind.FULL_RESTART, EventKind.JOB_STALL_ESCALATED)
_QUIET_FIELDS = {"time", "event", "type", "group", "attempt", "pid", "stacks", "rank_status", "step"}


def _describe(record: dict[str, Any]) -> str:
    fields = " ".join(f"{k}={v}" for k, v in record.items() if k not in _QUIET_FIELDS and v is not None and not isinstance(v, (dict, list)))
    return f"{record.get('event')} {fields}".strip()


def restart_cause(events: list[dict[str, Any]], group: int, attempt: int) -> str:
    """The supervisor's reason for launching ``attempt`` of ``group``, from its event log."""
    causes = [
        e
        for e in events
        if e.get("event") in _RESTART_CAUSES and (e.get("event") != EventKind.GROUP_FAILED or (e.get("group") == group and e.get("attempt") == attempt - 1))
    ]
    return _describe(causes[-1]) if causes else "cause not in events.jsonl"


class MarkerTracker:
    """Which markers a rank's records call for: a pure function of the records seen so far.

    Args:
        attempt: this rank's launch attempt (above 0: the group was relaunched).
        restart_text: what the restart marker says (see :func:`restart_cause`).
    """

    def __init__(self, attempt: int, restart_text: str = "") -> None:
        self.attempt, self.restart_text = attempt, restart_text
        self.last_step: Optional[int] = None
        self.members: Optional[tuple[int, ...]] = None

    def see(self, record: dict[str, Any]) -> list[tuple[Marker, int, str]]:
        """The markers ``record`` calls for: (marker, step, text)."""
        kind, name, out = record.get("type"), record.get("event"), []
        own_step = record.get("step") if isinstance(record.get("step"), int) else None
        if kind not in ("step", "event") or (kind == "step" and own_step is None):
            return out
        # Records that say which step the group is at: a step, or state arriving (heal, disk).
        anchor = own_step is not None and (kind == "step" or name in (EventKind.WEIGHTS_RECOVERED, EventKind.CHECKPOINT_LOADED))
        step = own_step if own_step is not None else (self.last_step if self.last_step is not None else 0)
        if anchor:
            if self.attempt > 0 and self.last_step is None:
                out.append((Marker.RESTART, step, f"attempt {self.attempt}: {self.restart_text}"))
            self.last_step = step
        if kind == "step":
            members = members_of(record)
            if record.get("sync", True) and members:
                if self.members is not None and members != self.members:
                    left, joined = sorted(set(self.members) - set(members)), sorted(set(members) - set(self.members))
                    change = ", ".join(x for x in (left and f"left {left}", joined and f"joined {joined}") if x)
                    out.append((Marker.QUORUM_CHANGE, step, f"groups {list(self.members)} -> {list(members)} ({change})"))
                self.members = members
            if record.get("sync", True) and not record.get("committed"):
                out.append((Marker.COMMIT_FAILED, step, f"step {step} not committed (quorum of {record.get('quorum_size')})"))
        elif name == EventKind.WEIGHTS_RECOVERED:
            size, seconds = (record.get("bytes") or 0) / 1e6, record.get("seconds") or 0.0
            out.append((Marker.HEAL, step, f"weights from replica rank {record.get('src_replica_rank')}: {size:.1f} MB in {seconds:.2f} s"))
        elif name == EventKind.CHECKPOINT_LOADED:
            out.append((Marker.CHECKPOINT_LOADED, step, f"checkpoint step {step} loaded from disk"))
        elif name in FAULT_EVENTS:
            out.append((Marker.FAULT, step, _describe(record)))
        return out


class TensorBoardSink:
    """Writes a group's rank 0 records as one TensorBoard run (a MetricSink of its RankReporter).

    Args:
        layout: the run's paths (the run goes to ``layout.tensorboard(group)``).
        group: the replica group.
        attempt: the launch attempt; a relaunch writes a new event file into the same run.
        flush_s: at most this many seconds of curves are lost when the rank is killed
            (markers are flushed at once).
    """

    def __init__(self, layout: RunLayout, group: int, attempt: int, flush_s: float = 1.0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        cause = restart_cause(read_jsonl(layout.events), group, attempt) if attempt > 0 else ""
        self.markers = MarkerTracker(attempt, cause)
        self.writer = SummaryWriter(layout.tensorboard(group), flush_secs=flush_s)

    def record(self, record: dict[str, Any]) -> None:
        wall = record.get("time")
        if record.get("type") == "step":
            step = record["step"]
            for field, tag in SCALARS.items():
                value = record.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(tag, value, step, walltime=wall)
            if record.get("participating_groups"):
                self.writer.add_scalar("ft/participating_groups", len(members_of(record)), step, walltime=wall)
        marks = self.markers.see(record)
        for marker, step, text in marks:
            self.writer.add_scalar(f"faults/{marker}", 1.0, step, walltime=wall)
            self.writer.add_text("faults", f"step {step}: **{marker}** {text}", step, walltime=wall)
        if marks:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
