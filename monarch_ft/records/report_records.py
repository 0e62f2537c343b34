"""The records of a rank's report file, typed: what the controller reads is one of four kinds.

A rank appends one JSON object per line (``monarch_ft.rank.components.metrics.RankReporter``);
each has a ``type``: ``step`` (a trained step: its numbers, whether it committed, its quorum),
``event`` (something that happened to the rank, named by an :class:`EventKind`), ``heartbeat``
(main-thread progress while no step is trained) or ``liveness`` (the main thread's phase, from a
thread of its own). :func:`parse_record` turns a line's object into one of the four dataclasses
below, so the controller dispatches on a type, not on string literals; a record of an unknown
type (a rank of a newer version) is kept as :class:`UnknownRecord` and ignored, never a crash.

Each keeps the object as written (``raw``): a step is relayed to ``metrics.jsonl`` and an event
to ``events.jsonl`` as the rank wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from monarch_ft.records.events import EventKind, StrEnum
from monarch_ft.records.members import members_of


class RecordType(StrEnum):
    """The ``type`` of a report record."""

    STEP = "step"
    EVENT = "event"
    HEARTBEAT = "heartbeat"
    LIVENESS = "liveness"


@dataclass(frozen=True)
class StepRecord:
    """One trained step of one rank (committed or not)."""

    raw: dict[str, Any]
    line: Optional[bytes] = field(default=None, compare=False, repr=False)
    """The line as the rank wrote it (``json.dumps`` of ``raw``), relayed to ``metrics.jsonl`` as
    is: encoding every step record again was a third of the controller's tick at 1,024 groups."""
    relayed: bool = field(default=False, compare=False)
    """Already in ``metrics.jsonl``: relayed by a controller that died before it saved past it
    (:class:`~monarch_ft.controller.takeover.ResumedTail`); taken in, not relayed again."""

    @property
    def step(self) -> int:
        return int(self.raw["step"])

    @property
    def rank(self) -> int:
        return int(self.raw["rank"])

    @property
    def group(self) -> int:
        return int(self.raw["group"])

    @property
    def attempt(self) -> Optional[int]:
        return self.raw.get("attempt")

    @property
    def committed(self) -> bool:
        return bool(self.raw.get("committed"))

    @property
    def loss(self) -> Optional[float]:
        return self.raw.get("loss")

    @property
    def quorum_id(self) -> int:
        return self.raw.get("quorum_id") or 0

    @property
    def state_hash(self) -> Optional[str]:
        return self.raw.get("state_hash")

    @property
    def participating_groups(self) -> tuple[int, ...]:
        return members_of(self.raw)

    @property
    def time(self) -> float:
        return float(self.raw.get("time") or 0.0)


@dataclass(frozen=True)
class RankEvent:
    """Something that happened to the rank: ``kind`` (an :class:`EventKind` member; a name
    this version does not know stays a string), its fields as written (``raw``, without
    ``type``)."""

    kind: Union[EventKind, str]
    raw: dict[str, Any]
    relayed: bool = field(default=False, compare=False)
    """Already in ``events.jsonl`` (as :attr:`StepRecord.relayed`)."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


@dataclass(frozen=True)
class Heartbeat:
    """Main-thread progress while the rank trains no step (holding the job open, waiting)."""

    raw: dict[str, Any]


@dataclass(frozen=True)
class Liveness:
    """A beat of the rank's liveness thread: the main thread's phase and since when."""

    raw: dict[str, Any]

    @property
    def phase(self) -> Optional[str]:
        return self.raw.get("phase")

    @property
    def phase_since(self) -> Optional[float]:
        return self.raw.get("phase_since")


@dataclass(frozen=True)
class UnknownRecord:
    """A record of a type this version does not read (ignored)."""

    raw: dict[str, Any]


ReportRecord = Union[StepRecord, RankEvent, Heartbeat, Liveness, UnknownRecord]


def parse_record(raw: dict[str, Any], line: Optional[bytes] = None, relayed: bool = False) -> ReportRecord:
    """The typed form of one report line's object (``line``: the line itself, kept by a step;
    ``relayed``: a step or event already relayed, see :attr:`StepRecord.relayed`)."""
    kind = raw.get("type")
    if kind == RecordType.STEP and "step" in raw:
        return StepRecord(raw, line, relayed)
    if kind == RecordType.EVENT and "event" in raw:
        fields = {k: v for k, v in raw.items() if k not in ("type", "event")}
        name = raw["event"]
        return RankEvent(EventKind(name) if name in EventKind._value2member_map_ else str(name), fields, relayed)
    if kind == RecordType.HEARTBEAT:
        return Heartbeat(raw)
    if kind == RecordType.LIVENESS:
        return Liveness(raw)
    return UnknownRecord(raw)
