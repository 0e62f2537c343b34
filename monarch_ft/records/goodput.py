"""Goodput and ETTR: the one definition the drill report, the goodput bench and eviction_bench share.

All of it reads the step records in ``metrics.jsonl`` (one per rank per step, monarch_ft.records.reports;
rank 0 speaks for its group) and, for rollbacks the records alone cannot show, ``job_rollback`` events.

**A useful group-step** is a (group, step) pair on the lineage of the final weights (:func:`lineage`):

- a group's steps are provisional until a sync keeps them (hsdp: every step is a sync; localsgd and
  diloco: the inner steps of a window wait for its sync). A sync keeps its window when it committed,
  the group's batch went into the update (the group is among ``participating_groups``) and the group
  did not heal into it (its state then came from a peer: its own window was thrown away);
- a rollback (a full restart or an integrity rollback resuming from a checkpoint: a ``job_rollback``
  event, or seen in the records as a group keeping a step it had already kept) gives up every kept
  step at or past the step it resumes from: those count zero, and the same steps trained again count
  once, when they are kept again;
- steps trained and never kept (a failed sync, a dead group's unsynced window, a heal, the tail after
  the last sync) count zero.

**Goodput** is useful group-steps per second of wall time from the job's launch (its ``job_started``
event, or the moment a bench started the process) to the last useful commit: start-up, imports, the
model's build and the first step are charged, and so is everything lost. Useful tokens per second are
that times the tokens of one group-step (batch x sequence x ranks per group, the same for every step).
**Per provisioned replica** divides it by every replica group the job holds resources for, warm
standbys included: a spare is not free.

**ETTR** (effective training time ratio) = useful group-steps x the fault-free median step time ÷
(groups x wall seconds). The step time is the median interval between one group's consecutive steps
(:func:`median_step_s`) in fault-free training, so a survivor that waits out a peer's failure adds
wall time and no steps: its stall is lost time, never counted as training. 1 would be every group
stepping at its fault-free median pace from launch to the end with nothing lost.

Pure functions of the records, so that fast tests pin them on recorded fixtures
(tests/unit/test_goodput.py) and the users cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from monarch_ft.records.events import EventKind
from monarch_ft.records.members import members_of
from monarch_ft.records.stats import percentile


def _is_step(m: dict) -> bool:
    return m.get("rank", 0) == 0 and "step" in m and "committed" in m and m.get("type", "step") == "step"


def _trained(m: dict) -> bool:
    """The record is a step that trained a batch (a group that healed into a sync trained none)."""
    return m.get("batch") is not None or "batch" not in m


@dataclass(frozen=True)
class Window:
    """One group's steps up to and including a sync (or its unsynced tail).

    Args:
        group, attempt: whose.
        steps: the step records of the steps it trained (rank 0), in order.
        sync: the sync's record; None for a tail no sync closed (the group died or the job ended).
        kept: the sync kept the window (see the module doc).
    """

    group: int
    attempt: int
    steps: tuple[dict, ...]
    sync: Optional[dict]
    kept: bool

    @property
    def time(self) -> float:
        """When the window was decided: its sync, or its last step for a tail."""
        last = self.sync if self.sync is not None else (self.steps[-1] if self.steps else None)
        return float(last["time"]) if last is not None else 0.0


def windows(metrics: Iterable[dict]) -> list[Window]:
    """Every group's windows, by the time they were decided (any ``ft.mode``).

    Args:
        metrics: step records of any ranks, any order (rank 0's are read).
    """
    out: list[Window] = []
    pending: dict[tuple[int, int], list[dict]] = {}
    for m in sorted((m for m in metrics if _is_step(m)), key=lambda m: m["time"]):
        key = (m["group"], m.get("attempt", 0))
        run = pending.setdefault(key, [])
        if _trained(m):
            run.append(m)
        if not m.get("sync", True):
            continue
        kept = bool(m.get("committed")) and not m.get("healed") and (m.get("participating_groups") is None or m["group"] in members_of(m))
        out.append(Window(m["group"], key[1], tuple(run), m, kept))
        pending[key] = []
    out += [Window(g, a, tuple(run), None, False) for (g, a), run in pending.items() if run]
    return sorted(out, key=lambda w: w.time)


@dataclass(frozen=True)
class Lineage:
    """The group-steps of the final training history.

    Args:
        useful: each useful (group, step) and the time of the commit that kept it (its sync).
        step_times: each useful (group, step) and the time of its own step record.
        trained: group-steps trained in all (kept or not, counted each time they were trained).
        rolled_back: kept group-steps a rollback later gave up (each time one did).
        redone: useful group-steps that had been given up by a rollback before: trained twice,
            counted once.
        rollbacks: how many rollbacks were applied (events and ones seen in the records).
    """

    useful: dict[tuple[int, int], float]
    step_times: dict[tuple[int, int], float]
    trained: int
    rolled_back: int
    redone: int
    rollbacks: int

    @property
    def count(self) -> int:
        return len(self.useful)

    @property
    def wasted(self) -> int:
        """Group-steps trained that are not in the final history (rolled back, never kept, re-done)."""
        return self.trained - self.count

    @property
    def end(self) -> Optional[float]:
        """The last useful commit's time (None: nothing useful)."""
        return max(self.useful.values(), default=None)


def rollbacks_of(events: Iterable[dict]) -> list[dict]:
    """The ``job_rollback`` events among ``events`` (each: ``time``, ``to_step``)."""
    return [e for e in events if e.get("event") == EventKind.JOB_ROLLBACK and e.get("to_step") is not None]


def lineage(metrics: Iterable[dict], rollbacks: Iterable[dict] = ()) -> Lineage:
    """The useful group-steps (see the module doc) of the records.

    Args:
        metrics: step records, any order.
        rollbacks: ``job_rollback`` events (``time``, ``to_step``: the first step trained again);
            a rollback the events do not name is seen when a group keeps a step it already kept.
    """
    wins = windows(metrics)
    useful: dict[tuple[int, int], float] = {}
    own: dict[tuple[int, int], float] = {}
    given_up: set[tuple[int, int]] = set()
    rolled_back = rollbacks_applied = 0
    pending = sorted(rollbacks, key=lambda e: e["time"])

    def roll_back(to_step: int) -> None:
        nonlocal rolled_back, rollbacks_applied
        gone = [k for k in useful if k[1] >= to_step]
        for k in gone:
            del useful[k], own[k]
            given_up.add(k)
        rolled_back += len(gone)
        rollbacks_applied += 1

    for w in wins:
        while pending and pending[0]["time"] <= w.time:
            roll_back(int(pending.pop(0)["to_step"]))
        if not w.kept:
            continue
        steps = [int(s["step"]) for s in w.steps]
        again = [s for s in steps if (w.group, s) in useful]
        if again:
            # Kept a second time: the job resumed from before it (a checkpoint) and trained it again.
            roll_back(min(again))
        for s, rec in zip(steps, w.steps):
            useful[(w.group, s)] = w.time
            own[(w.group, s)] = float(rec["time"])
    for e in pending:
        roll_back(int(e["to_step"]))
    redone = sum(1 for k in useful if k in given_up)
    trained = sum(len(w.steps) for w in wins)
    return Lineage(useful, own, trained, rolled_back, redone, rollbacks_applied)


def median_step_s(metrics: Iterable[dict], start: Optional[float] = None, end: Optional[float] = None) -> Optional[float]:
    """The median seconds between one group's consecutive steps (rank 0, one attempt), in ``(start, end]``.

    Inner steps count (they are steps); the interval includes what a step costs besides its own
    compute (data, records, a checkpoint save now and then). Taken on fault-free training, it is
    ETTR's pace. None with no two consecutive steps.

    Args:
        metrics: step records, any order.
        start, end: the window (None: unbounded on that side).
    """
    last: dict[tuple[int, int], float] = {}
    gaps: list[float] = []
    for m in sorted((m for m in metrics if _is_step(m) and _trained(m)), key=lambda m: m["time"]):
        t = float(m["time"])
        if (start is not None and t <= start) or (end is not None and t > end):
            continue
        key = (m["group"], m.get("attempt", 0))
        if key in last:
            gaps.append(t - last[key])
        last[key] = t
    return percentile(gaps, 50)


@dataclass(frozen=True)
class Goodput:
    """Goodput over one run (or one window of it).

    Args:
        launch: when the job was launched (the window's start; seconds since the epoch).
        end: the last useful commit (or the window's given end).
        useful: useful group-steps (on the final lineage) in ``(launch, end]``.
        trained: group-steps trained in all (``useful`` plus those rolled back or never kept).
        rolled_back: kept group-steps a rollback gave up.
        groups: the replica groups the job trains with (ETTR's denominator).
        provisioned: replica groups it holds resources for (``groups`` + warm standbys).
        tokens_per_group_step: tokens in one group-step (None: unknown).
    """

    launch: float
    end: float
    useful: int
    trained: int
    rolled_back: int
    groups: int
    provisioned: int
    tokens_per_group_step: Optional[int] = None

    @property
    def seconds(self) -> float:
        return self.end - self.launch

    @property
    def rate(self) -> Optional[float]:
        """Useful group-steps per second of wall time; None for an empty window."""
        return self.useful / self.seconds if self.seconds > 0 else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Useful tokens per second (None: the tokens of a group-step are not known)."""
        return self.rate * self.tokens_per_group_step if self.rate is not None and self.tokens_per_group_step else None

    @property
    def rate_per_provisioned(self) -> Optional[float]:
        """Useful group-steps per second per provisioned replica group (standbys counted)."""
        return self.rate / self.provisioned if self.rate is not None and self.provisioned > 0 else None

    def ettr(self, step_s: Optional[float]) -> Optional[float]:
        """Useful group-steps x ``step_s`` over groups x wall seconds (None without a pace).

        Args:
            step_s: the fault-free median step time (:func:`median_step_s` of fault-free training).
        """
        if step_s is None or self.seconds <= 0 or self.groups <= 0:
            return None
        return self.useful * step_s / (self.groups * self.seconds)


def goodput(
    metrics: Iterable[dict],
    launch: float,
    groups: int,
    provisioned: Optional[int] = None,
    end: Optional[float] = None,
    rollbacks: Iterable[dict] = (),
    tokens_per_group_step: Optional[int] = None,
) -> Optional[Goodput]:
    """Goodput of the useful group-steps committed after ``launch`` (and up to ``end``).

    Args:
        metrics: step records, any order.
        launch: the window's start: the job's launch (a steady-state rate may pass its first commit).
        groups: replica groups training.
        provisioned: replica groups held, standbys included (None: ``groups``).
        end: the window's end (None: the last useful commit); the lineage is that of the records
            up to it (what was final then).
        rollbacks: ``job_rollback`` events (:func:`rollbacks_of`).
        tokens_per_group_step: tokens of one group-step.

    Returns:
        None when the window is empty (nothing useful after ``launch``, or ``end`` not after it).
    """
    records = [m for m in metrics if end is None or m["time"] <= end]
    lin = lineage(records, [e for e in rollbacks if end is None or e["time"] <= end])
    inside = [t for t in lin.useful.values() if t > launch]
    stop = end if end is not None else max(inside, default=None)
    if stop is None or stop <= launch:
        return None
    return Goodput(
        launch=launch,
        end=stop,
        useful=len(inside),
        trained=lin.trained,
        rolled_back=lin.rolled_back,
        groups=groups,
        provisioned=provisioned if provisioned is not None else groups,
        tokens_per_group_step=tokens_per_group_step,
    )


# Seconds after a fault's recovery still charged to it by :func:`own_pace_kept`: the recovered group's
# first steps after a heal, and the survivors' catching up, run below the pace around them.
SETTLE_S = 3.0


def fault_spans(events: Iterable[dict], settle_s: float = SETTLE_S) -> list[tuple[float, float]]:
    """(from, to) for each injected fault: from its injection to its group's return (the
    ``fault_recovered`` event's ``back_at``) plus ``settle_s``; to infinity for one never back.

    Args:
        events: the run's events (``fault_injected``, ``fault_recovered``, matched by ``fault_id``).
        settle_s: seconds after the return still counted to the fault.
    """
    events = list(events)
    back = {e["fault_id"]: float(e.get("back_at") or e["time"]) for e in events if e.get("event") == EventKind.FAULT_RECOVERED and "fault_id" in e}
    out = []
    for e in events:
        if e.get("event") == EventKind.FAULT_INJECTED:
            end = back.get(e.get("fault_id"))
            out.append((float(e["time"]), end + settle_s if end is not None else math.inf))
    return out


@dataclass(frozen=True)
class OwnPace:
    """What a run's faults cost against its own pace between them (:func:`own_pace_kept`).

    Args:
        pace: group-steps trained per second in the time no fault's span touches.
        kept: useful group-steps over ``pace`` x ``seconds``: the share of its own undisturbed pace
            the run kept, from its first step to its last useful commit.
        seconds: from the first step to the last useful commit.
        clean_s: the seconds ``pace`` was measured over.
    """

    pace: float
    kept: float
    seconds: float
    clean_s: float


def own_pace_kept(
    metrics: Iterable[dict], events: Iterable[dict], rollbacks: Iterable[dict] = (), settle_s: float = SETTLE_S, bin_s: float = 0.5
) -> Optional[OwnPace]:
    """The useful group-steps a run kept against its **own** pace in the seconds between its faults.

    Goodput against a separate fault-free run compares two runs minutes apart, and on a shared
    machine the machine's speed moves between them by more than a few short recoveries cost (no-FT
    cells of one bench ran 55 to 79 group-steps/s, docs/results/goodput-bench): that ratio needs many
    repetitions to say anything. This one compares a run with itself: the pace is measured in the
    run's time outside every fault's span (:func:`fault_spans`), so it moves with the
    machine, and what the faults cost is what the run did not keep at that pace: their outages, the
    steps rolled back or never kept (only useful group-steps count), a slow return. It does not see
    a cost that lasts outside the spans, start-up (it starts at the first step), or a standby's
    standing cost (the fault-free cells pay it too): it is the faults' direct cost, reported beside
    goodput, never instead of it.

    Args:
        metrics: step records, any order.
        events: the run's events (its faults' spans).
        rollbacks: ``job_rollback`` events (:func:`rollbacks_of`).
        settle_s: seconds after a fault's return still counted to it.
        bin_s: the pace is counted in bins of this many seconds; a bin a span touches is left out.

    Returns:
        None with under one bin of steps, or no bin outside the faults' spans.
    """
    metrics = list(metrics)
    lin = lineage(metrics, rollbacks)
    trained = sorted(float(m["time"]) for m in metrics if _is_step(m) and _trained(m) and (m.get("committed") or not m.get("sync", True)))
    if not trained or lin.end is None:
        return None
    first, last = trained[0], lin.end
    bins = int((last - first) / bin_s)
    if bins < 1:
        return None
    counts = [0] * bins
    for t in trained:
        i = int((t - first) / bin_s)
        if i < bins:
            counts[i] += 1
    spans = fault_spans(events, settle_s)
    clean = [i for i in range(bins) if not any(first + i * bin_s < b and first + (i + 1) * bin_s > a for a, b in spans)]
    pace = sum(counts[i] for i in clean) / (len(clean) * bin_s) if clean else 0.0
    if pace <= 0:
        return None
    seconds = last - first
    useful = sum(1 for t in lin.useful.values() if t >= first)
    return OwnPace(pace=pace, kept=useful / (pace * seconds), seconds=seconds, clean_s=len(clean) * bin_s)


def goodput_ratio(rate: Optional[float], fault_free_rate: Optional[float]) -> Optional[float]:
    """Goodput over a fault-free rate; None if either is unknown (or the baseline is 0)."""
    if rate is None or not fault_free_rate:
        return None
    return rate / fault_free_rate
