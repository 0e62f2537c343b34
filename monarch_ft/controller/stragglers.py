"""Fail-slow groups: which group is a straggler, and whether evicting it pays (pure decisions).

In synchronous HSDP every group waits for the slowest one at each cross-group allreduce, so one
degraded machine (a throttled CPU, a noisy neighbour, a slow link) sets everyone's pace without
failing anything; the hang model (:mod:`monarch_ft.controller.hangs`) is built to ignore slowness.
This module compares each group with its peers instead:

- its **compute** seconds per step (the step's wall time less its quorum and cross-group sync:
  :func:`~monarch_ft.records.reports.compute_seconds`), not the wall step, which every group shares;
- its **collective** seconds per step (``xgroup_s``, the cross-group allreduce), for link slowness.

A group each of whose newest ``window`` steps took more than ``factor`` x the median of its
peers' times for that same step (and ``min_excess_s`` more, so that a few milliseconds of noise
on a tiny model are never a straggler) is one: every step, not the window's median, so a burst
of load on a shared machine that slows one group for a few steps names nobody. A group far
slower (``STRONG_FACTOR`` x ``factor``) is named on most steps of its window (a CPU quota lets a
short step run at full speed now and then: :func:`_verdict`). A group's per-step time is its slowest
rank's (inside a group the ranks wait for each other in FSDP's collectives, so all of them look
slow; the slowest is the one named). Machine-wide load slows every group alike: the ratio to the
peers stays near 1 and nobody is flagged.

Collective time cannot name a link straggler: in a ring allreduce every member waits for the
slowest link, so a rate-limited link (``slow_link``) lengthened every group's collective alike in
a drill (1.07-1.24 s each); and a group that others wait for spends *less* time in it. A slow link
is therefore found by measuring it (active localisation): when the job's collective time per step
rises while its compute does not, each rank's link is timed with a fixed payload each way
(:data:`PROBE_BYTES`; :mod:`monarch_ft.controller.link_probe`, :func:`probe_due` says when), and
a group whose link is slower than ``factor`` x its peers' median in two rounds in a row is a
**link** straggler (:func:`find_link_stragglers`, :func:`confirm_link_stragglers`). A link slowed machine-wide slows every group's probe alike: nobody
is named. A group slow at compute over a window is not judged on its link (a throttled rank answers a
probe late).

Eviction (``ft.straggler=evict``) pays when the time the straggler costs the job over the
recovery's own duration exceeds what the recovery costs; see :func:`eviction_pays`; a CPU
straggler must also have cost that much already since it was named (:func:`cost_so_far`).
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from monarch_ft.records.events import StrEnum
from monarch_ft.records.reports import compute_seconds


# Windows of steps kept per group (see StragglerWatch.observe).
KEEP_WINDOWS = 10
# A far slower group is named on most steps of its window, not every one (see _verdict): this share
# of the window's steps slow, and the median of its per-step ratios to its peers at least
# STRONG_FACTOR x ft.straggler_factor.
MOST_SHARE = 0.8
STRONG_FACTOR = 2.0
# A group slower for longer is named on fewer of its steps (see _verdict): over SUSTAINED_WINDOWS
# windows, this share of the steps slow and the median per-step ratio at least SUSTAINED_FACTOR x
# ft.straggler_factor.
SUSTAINED_WINDOWS = 2
SUSTAINED_SHARE = 0.7
SUSTAINED_FACTOR = 4 / 3

# The link probe (find_link_stragglers, probe_due). Bytes timed each way per rank: well past a
# token bucket's burst (tc tbf's 4 KiB), a fraction of a millisecond on a healthy link of a
# gigabit or more, 0.1 s at 20 Mbit/s.
PROBE_BYTES = 256 << 10
# A link straggler's probe also exceeds its peers' median by this much (on a busy machine a
# healthy probe's answer waits a few ms for its process to be scheduled).
PROBE_MIN_EXCESS_S = 0.02
# The job's collective time must exceed its floor by this much, too, to start a round (on a
# loaded 2-core machine it wanders 20-30 ms above its floor; a 20 Mbit/s link added a second).
TRIGGER_MIN_RISE_S = 0.05
# A collective rise this many times the compute's own rise is a link's, however much compute
# rose beside it: on a 2-core machine a 16 ms compute floor doubles for seconds at a time, and a
# drill's 20 Mbit/s link (collective +0.9 s, compute +0.03 s) waited 10 s for its first round
# behind the compute rule alone (machine-wide load raises both alike: ratio 1-2).
TRIGGER_DOMINANCE = 10.0
# Steps each group's newest collective and compute time are taken over to tell a rise (fewer
# than a window: a slow link can cost a second a step, and a probe round is cheap).
TRIGGER_STEPS = 3
# Seconds between two probe rounds at the most often (a rise that persists, a link straggler
# rechecked until it clears).
PROBE_GAP_S = 5.0
# Seconds after a round that found a link slow before the round that confirms it: long enough
# that a rank's probe server kept from a core by load (tens of ms) is not kept again, short
# enough that a slow link is named a second or two later, not a PROBE_GAP_S later.
CONFIRM_GAP_S = 1.0


class SlowKind(StrEnum):
    """What a straggler is slow at."""

    CPU = "cpu"  # its own compute (forward, backward, optimizer)
    LINK = "link"  # the cross-group collective


@dataclass(frozen=True)
class StragglerLimits:
    """``ft.straggler_factor``, ``ft.straggler_window`` and the absolute floor.

    Args:
        factor: a group slower than this multiple of its peers' median is a straggler.
        window: steps each group's median is taken over (and the fewest a group needs reported).
        min_excess_s: seconds a straggler's median must exceed the peers' by, as well.
    """

    factor: float = 1.5
    window: int = 10
    min_excess_s: float = 0.005


@dataclass(frozen=True)
class Straggler:
    """One group found slower than its peers.

    Args:
        group: the group.
        rank: its slowest rank over the window.
        kind: cpu (compute) or link (the cross-group collective).
        seconds: its median seconds per step (of that kind) over the window.
        median_s: the median over the window of its peers' median time per step.
        steps: the window's steps (first, last); a link straggler's: the job's step when probed.
        loss_s: seconds the job loses per step while it stays (None: ``seconds - median_s``, a
            CPU straggler's excess; a link straggler's is the rise of the job's collective time).
    """

    group: int
    rank: int
    kind: SlowKind
    seconds: float
    median_s: float
    steps: tuple[int, int]
    loss_s: Optional[float] = None

    @property
    def ratio(self) -> float:
        return self.seconds / self.median_s if self.median_s > 0 else float("inf")

    def fields(self) -> dict:
        """The ``straggler_detected`` event's fields (a link straggler's ``seconds`` and
        ``median_s``: its probe's and its peers' median seconds for :data:`PROBE_BYTES` one way,
        the slower way; with the same as Mbit/s, and the job's loss per step)."""
        out = {
            "group": self.group,
            "rank": self.rank,
            "slow_kind": self.kind.value,
            "seconds": round(self.seconds, 4),
            "median_s": round(self.median_s, 4),
            "ratio": round(self.ratio, 2),
            "steps": list(self.steps),
        }
        if self.kind is SlowKind.LINK:
            out.update(probe_bytes=PROBE_BYTES, mbit_s=_mbit_s(self.seconds), median_mbit_s=_mbit_s(self.median_s))
        if self.loss_s is not None:
            out["loss_s_per_step"] = round(self.loss_s, 4)
        return out


def _mbit_s(seconds: float) -> Optional[float]:
    return round(PROBE_BYTES * 8 / seconds / 1e6, 2) if seconds > 0 else None


def own_seconds(rec: dict, previous: Optional[tuple[int, float]], compute: Optional[float] = None) -> float:
    """A step record's own seconds: the rank's whole loop iteration (from its previous step
    record to this one) less the time it waited for the other groups (``quorum_s``, ``xgroup_s``);
    :func:`~monarch_ft.records.reports.compute_seconds` (the step's wall time less the same)
    where the previous iteration is not known (``previous``: that record's step and time).

    Why not compute alone: a CFS quota (a throttled container, chaos ``slow``) stops a process
    wherever its period's share runs out, and that is inside forward/backward only when they
    need more than the share. With a share just larger (a rank measured busy before its quota
    was set), the stop fell between steps (the report, the loop) or in the collective phases,
    where every group waits alike, and compute_s read full speed on 40% of the slowed group's
    steps while its peers waited for it in their quorum: a recorded drill (30 s at 60% of its
    CPU) was named after 50 of its steps. Waiting is the one part a group does not cause: a
    group the others wait for waits least. Every record of a rank carries its write ``time``.

    Args:
        rec: a committed step record.
        previous: the (step, time) of the same rank's step record before it, any commit state.
        compute: ``compute_seconds(rec)`` where the caller has it already.
    """
    if compute is None:
        compute = compute_seconds(rec)
    if previous is None or rec.get("time") is None or int(rec["step"]) != previous[0] + 1:
        return compute
    waited = float(rec.get("quorum_s") or 0.0) + float(rec.get("xgroup_s") or 0.0)
    return max(compute, float(rec["time"]) - previous[1] - waited)


@dataclass
class GroupTimes:
    """One group's newest steps: step -> (own seconds, compute seconds, collective seconds) of
    its slowest rank (by own seconds), and which rank that was."""

    attempt: int = -1
    own: dict[int, float] = field(default_factory=dict)
    compute: dict[int, float] = field(default_factory=dict)
    collective: dict[int, float] = field(default_factory=dict)
    slowest: dict[int, int] = field(default_factory=dict)
    # Whether every step was added in increasing order (StragglerWatch.observe's records, as
    # a rank writes them): the dicts' first key is then the oldest step, and the last the newest.
    ordered: bool = field(default=False, compare=False, repr=False)

    def trim(self, keep: int) -> None:
        # The oldest steps past ``keep``: usually one, once the window is full (a sort of the
        # hundred kept steps at every record was a fiftieth of a tick at 1,024 groups; a look
        # for the smallest of them, a tenth of the detector's time).
        extra = len(self.own) - keep
        if extra <= 0:
            return
        oldest = (next(iter(self.own)),) if extra == 1 and self.ordered else heapq.nsmallest(extra, self.own)
        for step in oldest:
            self.own.pop(step, None)
            self.compute.pop(step, None)
            self.collective.pop(step, None)
            self.slowest.pop(step, None)


@dataclass
class StragglerWatch:
    """The step times the detector judges on, per group (part of the controller's own view:
    a new controller relearns them over one window).

    Only committed steps of a group's current attempt count: a relaunched group's first steps
    (lazy initialisation, healing) and a failed one's last say nothing about its pace.
    """

    groups: dict[int, GroupTimes] = field(default_factory=dict)
    # (group, rank, attempt) whose first step was seen (and left out).
    seen: set[tuple[int, int, int]] = field(default_factory=set)
    # Groups named as stragglers, and of which kind (named once until they recover).
    flagged: dict[int, str] = field(default_factory=dict)
    # Why each flagged group is kept under ft.straggler=evict (said again only when it changes:
    # a standby that becomes ready, or steps running out, turn the decision).
    kept: dict[int, str] = field(default_factory=dict)
    # The first step of the window that named each flagged CPU straggler (its cost so far, see
    # cost_so_far): how long it has been slow, until it is cleared or replaced.
    named_since: dict[int, int] = field(default_factory=dict)
    # The link probe: the job's lowest collective and compute seconds per step seen (medians
    # over groups of each one's newest TRIGGER_STEPS: the pace a rise is told from), when the
    # last round started, and the link stragglers the last round found (kept until the next).
    collective_floor_s: Optional[float] = None
    compute_floor_s: Optional[float] = None
    last_probe_at: float = float("-inf")
    link_found: dict[int, Straggler] = field(default_factory=dict)
    # Links the last round found slow and no round has confirmed yet (confirm_link_stragglers).
    link_suspects: dict[int, Straggler] = field(default_factory=dict)
    # Whether the job's collective rose past its floor, at the last look at its pace (probe_due).
    collective_rose: bool = False
    # (group, rank, attempt) -> the (step, time) of its newest step record (own_seconds).
    last_record: dict[tuple[int, int, int], tuple[int, float]] = field(default_factory=dict)

    def observe(self, rec: dict, window: int) -> None:
        """Take one step record of a rank (its group, rank, attempt, step and timings), in the
        order the rank wrote them: every one, committed or not, marks where its next iteration began."""
        group, rank, attempt = int(rec["group"]), int(rec["rank"]), int(rec.get("attempt") or 0)
        key = (group, rank, attempt)
        previous = self.last_record.get(key)
        written = rec.get("time")
        if written is not None:
            self.last_record[key] = (int(rec["step"]), float(written))
        if not rec.get("committed") or rec.get("step_time_s") is None:
            return
        if key not in self.seen:
            self.seen.add(key)
            return
        times = self.groups.get(group)
        if times is None:  # not setdefault: that built a GroupTimes (four dicts) for every record
            times = self.groups[group] = GroupTimes(ordered=True)
        if attempt != times.attempt:
            if attempt < times.attempt:
                return  # a late record of an attempt already replaced
            times = self.groups[group] = GroupTimes(attempt, ordered=True)
        step = int(rec["step"])
        compute = compute_seconds(rec)
        own = own_seconds(rec, previous, compute)
        was = times.own.get(step)
        if was is None and times.ordered and times.own and step < next(reversed(times.own)):
            times.ordered = False
        if was is None or own >= was:
            times.own[step] = own
            times.slowest[step] = rank
        times.compute[step] = max(times.compute.get(step, 0.0), compute)
        times.collective[step] = max(times.collective.get(step, 0.0), float(rec.get("xgroup_s") or 0.0))
        # Many windows kept: a slow group falls behind and out of quorums (TorchFT goes on
        # without a group that does not join in time), so its steps are compared with its
        # peers' times for the same steps, long past for them.
        times.trim(KEEP_WINDOWS * window)

    def forget(self, group: int) -> None:
        """``group`` was relaunched or replaced: its times so far are another attempt's."""
        self.groups.pop(group, None)
        self.flagged.pop(group, None)
        self.kept.pop(group, None)
        self.named_since.pop(group, None)
        self.link_found.pop(group, None)
        self.link_suspects.pop(group, None)
        for key in [k for k in self.last_record if k[0] == group]:
            del self.last_record[key]


def _median_of(values: Iterable[float]) -> float:
    return statistics.median(list(values))


class StepTable:
    """Every compared group's time at each step, sorted, made for a step when it is first asked
    for: one table per judgement, so that judging G groups costs G x (steps looked at) and not
    G x G x (steps kept) (each group's peers looked up step by step, as it first was: 16 groups
    spent a tenth of the controller's tick there; benchmarks/scale_bench.py).

    Why on demand: a judgement looks at each group's newest steps (two windows), which are
    the same few steps for groups in one quorum, while each group keeps ten windows (a slow
    group's steps are compared with its peers' long past). A table of every kept step of every
    group was most of a judgement: 41 ms a second at 1,024 groups.

    Args:
        times: each compared group's seconds per step.
    """

    def __init__(self, times: Iterable[dict[int, float]]) -> None:
        self._times = list(times)
        self._made: dict[int, list[float]] = {}

    def get(self, step: int) -> list[float]:
        """The sorted times at ``step`` ([] when no group has it)."""
        made = self._made.get(step)
        if made is None:
            made = self._made[step] = sorted(t[step] for t in self._times if step in t)
        return made

    def __getitem__(self, step: int) -> list[float]:
        return self.get(step)


def _median_without(values: list[float], own: float) -> float:
    """The median of sorted ``values`` with one ``own`` taken out (its peers' median at a step):
    what ``statistics.median`` gives for the list without it, without copying it."""
    i = bisect.bisect_left(values, own)
    n = len(values) - 1

    def at(k: int) -> float:
        return values[k] if k < i else values[k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _slow_steps(own: dict[int, float], table: StepTable, limits: StragglerLimits, windows: int = 1) -> Optional[tuple[list[int], list[float], list[bool]]]:
    """The group's newest ``windows`` x ``window`` steps that a peer also reported, the peers'
    median time for each, and whether the group was slow at each; None with fewer such steps.

    Args:
        own: the group's times per step.
        table: every compared group's times per step, the group's own among them (:class:`StepTable`).
        limits: the window, factor and floor.
        windows: how many windows of steps.
    """
    steps = windows * limits.window
    # Newest first, until enough: the table is made only for the steps looked at.
    aligned = []
    for s in sorted(own, reverse=True):
        if len(table.get(s)) > 1:
            aligned.append(s)
            if len(aligned) == steps:
                break
    if len(aligned) < steps:
        return None
    aligned.reverse()
    medians = [_median_without(table[s], own[s]) for s in aligned]
    return aligned, medians, [own[s] > limits.factor * m and own[s] - m > limits.min_excess_s for s, m in zip(aligned, medians)]


# The ways a group is named (see _verdict): (windows of steps judged, the share of them slow at
# least, the median per-step ratio to the peers at least this x ft.straggler_factor).
VERDICT_RULES: tuple[tuple[int, float, float], ...] = (
    (1, 1.0, 1.0),
    (1, MOST_SHARE, STRONG_FACTOR),
    (SUSTAINED_WINDOWS, SUSTAINED_SHARE, SUSTAINED_FACTOR),
)


def _verdict(own: dict[int, float], table: StepTable, limits: StragglerLimits) -> Optional[tuple[float, float, tuple[int, int]]]:
    """(own median, peers' median, (first, last step)) over the steps judged, when one of
    :data:`VERDICT_RULES` holds; None otherwise (or with fewer such steps). Each judges the
    group's newest steps that a peer also reported, each against the peers' median at that same
    step:

    - every one of its newest ``window`` steps slow;
    - or most of them (:data:`MOST_SHARE`), the group far slower (the median of its per-step
      ratios at least :data:`STRONG_FACTOR` x ``factor``);
    - or over :data:`SUSTAINED_WINDOWS` windows, :data:`SUSTAINED_SHARE` of them slow at a median
      ratio of :data:`SUSTAINED_FACTOR` x ``factor``.

    Why more than one way: under a CFS quota (a throttled container, chaos ``slow``) a step
    short enough to fit in one period's share runs at full speed, and every such step started
    the every-step window again: a group at 30% of its CPU (5x its peers) was named 3.1-25.1 s
    after the quota began in thirteen recorded runs. Replayed on those runs, "8 of 10 slow and
    3x" named it 2.0-4.3 s after, and named no healthy group anywhere recorded, where "8 of 10"
    alone named healthy ones at 8 ranks on 2 cores (1.6-2.7x their peers) and once in a 3-group
    drill (docs/design/stragglers.md). Where the quota is a little larger than a step needs (a
    rank measured busy before it was set), a period's share fits one step and most of the next:
    a group 2-3.5x slower on three steps of four, at full speed on the fourth, met neither rule
    for 50 and 70 of its steps in two recorded drills (60% of what it used); 14 of 20 slow at 2x
    names it over two windows, where a burst of load on one group (a few steps at a time) does not
    last (docs/design/stragglers.md, "Replays")."""
    # The newest steps of the longest rule, worked out once: each rule judges their tail (a
    # group's newest steps are the same whichever rule looks; three passes over them were most
    # of a judgement, 65 ms a second at 1,024 groups).
    longest = _slow_steps(own, table, limits, max(w for w, _, _ in VERDICT_RULES))
    for windows, share, ratio in VERDICT_RULES:
        if longest is not None:
            n = windows * limits.window
            found: Optional[tuple[list[int], list[float], list[bool]]] = (longest[0][-n:], longest[1][-n:], longest[2][-n:])
        else:
            found = _slow_steps(own, table, limits, windows)
        if found is None:
            continue
        aligned, medians, slow = found
        if sum(slow) < share * len(slow):
            continue
        ratios = [own[s] / m if m > 0 else float("inf") for s, m in zip(aligned, medians)]
        if ratio > 1.0 and statistics.median(ratios) < ratio * limits.factor:
            continue
        return _median_of(own[s] for s in aligned), _median_of(medians), (aligned[0], aligned[-1])
    return None


def back_to_pace(watch: "StragglerWatch", group: int, active: Iterable[int], limits: StragglerLimits) -> bool:
    """A group named a straggler is back to its peers' pace: none of its newest ``window``
    steps was slow (a straggler is named on a whole window of slow steps and cleared on a whole
    window of normal ones, so one fast step does not clear it and name it again a step later).
    A group no longer compared (not stepping, or its window restarted) counts as back. A link
    straggler is back when a probe round finds its link at its peers' pace (not judged here)."""
    active = set(active)
    groups = {g: t for g, t in watch.groups.items() if g in active}
    if group not in groups or len(groups) < 2:
        return True
    found = _slow_steps(groups[group].own, StepTable(t.own for t in groups.values()), limits)
    return found is None or not any(found[2])


def find_stragglers(watch: StragglerWatch, active: Iterable[int], limits: StragglerLimits) -> list[Straggler]:
    """The groups among ``active`` that are stragglers now (see the module docstring).

    A group is one when each of its newest ``window`` steps took more than ``factor`` x (and
    ``min_excess_s`` more than) the median of its peers' times for the same step: a burst of
    load that slows one group for a step or two, as a shared machine does, never names it.

    Args:
        watch: the step times seen.
        active: the groups stepping in the job now (others are not compared).
        limits: factor, window and floor.

    Returns:
        The CPU stragglers (link ones come from probes: :func:`find_link_stragglers`); [] while
        fewer than two groups are compared.
    """
    active = set(active)
    groups = {g: t for g, t in watch.groups.items() if g in active}
    if len(groups) < 2:
        return []

    def straggler(g: int, kind: SlowKind, found: tuple[float, float, tuple[int, int]]) -> Straggler:
        t, (first, last) = groups[g], found[2]
        ranks = [r for s, r in t.slowest.items() if first <= s <= last]
        rank = max(set(ranks), key=ranks.count) if ranks else 0
        return Straggler(g, rank, kind, found[0], found[1], (first, last))

    out = []
    own = StepTable(t.own for t in groups.values())
    for g in sorted(groups):
        found = _verdict(groups[g].own, own, limits)
        if found is not None:
            out.append(straggler(g, SlowKind.CPU, found))
    return out


@dataclass(frozen=True)
class LinkProbe:
    """One rank's link, timed: seconds for :data:`PROBE_BYTES` to the rank and from it, and for
    an empty request's round trip on the same connection (``rtt_s``: 0 when not timed)."""

    group: int
    rank: int
    to_rank_s: float
    from_rank_s: float
    rtt_s: float = 0.0

    @property
    def seconds(self) -> float:
        """The slower way (a link may be slow one way only), net of the round trip.

        Why net: what a transfer waits for besides the link is the rank's probe thread: woken,
        scheduled, given the interpreter lock, once per request whatever its size. On a loaded
        machine that wait was the whole figure: a healthy rank starved of CPU beside two hogs and
        a second job answered in 26 and 18 ms two rounds in a row against its peers' 0.4 ms, and
        was named a link straggler and evicted. An empty request waits the same; a slow link
        delays only the bytes (a token bucket passes a few bytes at once). So the figure is what
        the payload took beyond that round trip: the starved rank's 26 ms less its ~20 ms, a
        20 Mbit/s link's 0.51 s less a fraction of a millisecond."""
        return max(0.0, max(self.to_rank_s, self.from_rank_s) - self.rtt_s)


class ProbeReason(StrEnum):
    """Why a probe round runs (``link_probed``'s ``reason``)."""

    COLLECTIVE_ROSE = "collective_rose"  # the job's collective time rose while its compute did not
    CONFIRM = "confirm"  # the last round found a link slow: is it slow again? (named only then)
    RECHECK = "recheck"  # a link straggler is named: is it still slow?
    PERIODIC = "periodic"  # ft.link_probe_s since the last round (a link slow from the start shows no rise)


def _newest_median(times: dict[int, float], steps: int) -> Optional[float]:
    newest = [times[s] for s in sorted(times)[-steps:]]
    return _median_of(newest) if len(newest) >= steps else None


def _collective_rose(watch: StragglerWatch, active: list[int], limits: StragglerLimits) -> bool:
    """Whether the job's collective time now rose past its floor, unexplained by its compute
    (:func:`probe_due`'s first rule); lowers the floors to the pace now."""
    pace = job_pace(watch, active)
    rose = False
    if pace is not None:
        coll, comp = pace
        if watch.collective_floor_s is not None and watch.compute_floor_s is not None:
            floor, compute_floor = watch.collective_floor_s, max(watch.compute_floor_s, limits.min_excess_s)
            explained = comp > limits.factor * compute_floor and (coll - floor) < TRIGGER_DOMINANCE * (comp - compute_floor)
            rose = coll > limits.factor * floor and coll - floor > TRIGGER_MIN_RISE_S and not explained
        watch.collective_floor_s = coll if watch.collective_floor_s is None else min(watch.collective_floor_s, coll)
        watch.compute_floor_s = comp if watch.compute_floor_s is None else min(watch.compute_floor_s, comp)
    return rose


def job_pace(watch: StragglerWatch, active: Iterable[int], steps: int = TRIGGER_STEPS) -> Optional[tuple[float, float]]:
    """The job's collective and compute seconds per step now: the median over the groups among
    ``active`` of each one's median over its newest ``steps`` steps; None while fewer than two
    groups have that many."""
    wanted = set(active)
    groups = [t for g, t in watch.groups.items() if g in wanted]
    coll = [m for m in (_newest_median(t.collective, steps) for t in groups) if m is not None]
    comp = [m for m in (_newest_median(t.compute, steps) for t in groups) if m is not None]
    if len(coll) < 2 or len(comp) < 2:
        return None
    return _median_of(coll), _median_of(comp)


def cpu_suspects(watch: StragglerWatch, active: Iterable[int], limits: StragglerLimits, collective_rise_s: float = 0.0) -> set[int]:
    """Groups whose median compute over their newest ``window`` steps exceeds ``factor`` x their
    peers' (and ``min_excess_s`` more): slow at compute, if not yet on every step of a window.
    Their ranks may answer a probe late (a CPU quota, a stopped process), so they are not judged
    on their link. A whole window's median, not a few steps': on a loaded 2-core machine a
    group's compute of 10-100 ms is 2x its peers' for three steps at a time (a run so left the
    slow-link group unjudged, twice).

    Unless the job's collective rose far more than that group's compute: a group slow at compute
    makes its peers wait about its excess at each allreduce, so a collective rise over
    :data:`TRIGGER_DOMINANCE` times its excess is not its compute's doing, and its link is judged
    (the rule that starts a round, :func:`probe_due`, reads the two rises alike). A slow link
    raises its own group's compute a little too (a 20 Mbit/s link: 16 -> 40 ms, for every step
    it lasted, while the collective rose 1.2 s): the stress run that found it had the slow-link
    group spared by every round, never named.

    Args:
        watch: the step times seen.
        active: the groups running now.
        limits: ``factor``, ``window`` and ``min_excess_s``.
        collective_rise_s: seconds per step the job's collective is over its floor now
            (:func:`collective_loss`; 0: not known, every compute suspect is spared).
    """
    own = {g: m for g, t in watch.groups.items() if g in set(active) for m in [_newest_median(t.own, limits.window)] if m is not None}
    out = set()
    for g, m in own.items():
        peers = [v for h, v in own.items() if h != g]
        if not peers:
            continue
        excess = m - _median_of(peers)
        if m > limits.factor * _median_of(peers) and excess > limits.min_excess_s and collective_rise_s < TRIGGER_DOMINANCE * excess:
            out.add(g)
    return out


def probe_due(watch: StragglerWatch, active: Iterable[int], limits: StragglerLimits, now: float, interval_s: float, pace: bool = True) -> Optional[ProbeReason]:
    """Whether to time every group's link now, and why; also lowers the job's floors of
    collective and compute time to its pace now (:func:`job_pace`).

    The rule, at most once per :data:`PROBE_GAP_S`:

    - the job's collective seconds per step exceed ``factor`` x its floor (and
      :data:`TRIGGER_MIN_RISE_S` more) while its compute stays within ``factor`` x its own floor
      or rose by less than :data:`TRIGGER_DOMINANCE` times less, and no group is a CPU
      straggler (one that others wait for lengthens their collective: that rise is explained);
    - or the last round found a link slow that is not named yet: a round :data:`CONFIRM_GAP_S`
      after it tells whether it is (:func:`confirm_link_stragglers`);
    - or a link straggler is named (a round tells whether it cleared);
    - or ``interval_s`` (``ft.link_probe_s``; 0: never) passed since the last round.

    Its cost: a round moves :data:`PROBE_BYTES` each way per rank (twice: the faster counts),
    one rank at a time: 20-60 ms for three ranks on healthy links here, 1.7 s with one at 20 Mbit/s.

    ``pace``: look at the job's pace now (False: the last look's verdict stands; the pace
    changes only with new steps, and a look costs groups x steps).
    """
    if pace:
        watch.collective_rose = _collective_rose(watch, list(active), limits)
    rose = watch.collective_rose
    if watch.link_suspects and now - watch.last_probe_at >= CONFIRM_GAP_S:
        return ProbeReason.CONFIRM
    if now - watch.last_probe_at < PROBE_GAP_S:
        return None
    if any(kind == SlowKind.LINK for kind in watch.flagged.values()):
        return ProbeReason.RECHECK
    if rose and not any(kind == SlowKind.CPU for kind in watch.flagged.values()):
        return ProbeReason.COLLECTIVE_ROSE
    if interval_s > 0 and now - watch.last_probe_at >= interval_s:
        return ProbeReason.PERIODIC
    return None


def collective_loss(watch: StragglerWatch, active: Iterable[int]) -> float:
    """Seconds per step the job's collective takes over its floor now (what a slow link costs
    every group at each allreduce); 0 when not known."""
    pace = job_pace(watch, active)
    if pace is None or watch.collective_floor_s is None:
        return 0.0
    return max(0.0, pace[0] - watch.collective_floor_s)


def find_link_stragglers(probes: Iterable[LinkProbe], limits: StragglerLimits, skip: Iterable[int] = (), step: int = 0, loss_s: float = 0.0) -> list[Straggler]:
    """The groups whose link is slow against their peers', from one probe round.

    A group's figure is its slowest rank's (the slower way). It is a link straggler when that
    exceeds ``factor`` x the median of the other groups' figures, and
    :data:`PROBE_MIN_EXCESS_S` more. Groups in ``skip`` (:func:`cpu_suspects`) are neither
    judged nor counted as peers. Fewer than two groups with a figure: nobody.

    Args:
        probes: the round's figures (a rank that did not answer has none).
        limits: the factor.
        skip: groups slow at compute now.
        step: the job's step (the verdict's ``steps``).
        loss_s: the job's loss per step now (:func:`collective_loss`).
    """
    skip = set(skip)
    worst: dict[int, LinkProbe] = {}
    for p in probes:
        if p.group not in skip and (p.group not in worst or p.seconds > worst[p.group].seconds):
            worst[p.group] = p
    if len(worst) < 2:
        return []
    out = []
    for g, p in sorted(worst.items()):
        median = _median_of(q.seconds for h, q in worst.items() if h != g)
        if p.seconds > limits.factor * median and p.seconds - median > PROBE_MIN_EXCESS_S:
            out.append(Straggler(g, p.rank, SlowKind.LINK, p.seconds, median, (step, step), loss_s=loss_s))
    return out


def confirm_link_stragglers(
    verdicts: Iterable[Straggler], suspects: dict[int, Straggler], named: Iterable[int]
) -> tuple[list[Straggler], dict[int, Straggler]]:
    """A round's link verdicts, split into the confirmed and the new suspects.

    A group is a link straggler only when two rounds in a row find its link slow, or when it is
    one already (a recheck that finds it slow keeps it). Why: under CPU load a rank's probe server
    can wait tens of milliseconds for a core, and one round then finds a healthy link "slow": 16
    ranks on 2 cores (load 28, benchmarks/scale_bench.py) named twelve such link stragglers in
    one run (26-53 ms against peers' 0.3-10 ms), each gone in the next round; under
    ``ft.straggler=evict`` one could have been evicted. The same wait rarely hits the same rank
    again a second later; a slow link is slow in every round.

    Args:
        verdicts: this round's link stragglers (:func:`find_link_stragglers`).
        suspects: the groups the previous round found slow and no round has confirmed.
        named: the groups named link stragglers now.

    Returns:
        The confirmed stragglers (this round's figures), and the new suspects: the groups this
        round found slow for the first time (a suspect not found slow again is dropped).
    """
    named = set(named)
    confirmed, new = [], {}
    for s in verdicts:
        if s.group in suspects or s.group in named:
            confirmed.append(s)
        else:
            new[s.group] = s
    return confirmed, new


def loss_rate(straggler: Straggler) -> float:
    """Seconds the job loses per step while the straggler stays: a CPU straggler's excess over
    its peers (every group waits for it at each allreduce); a link straggler's, the rise of the
    job's collective time (its ``loss_s``)."""
    if straggler.loss_s is not None:
        return max(0.0, straggler.loss_s)
    return max(0.0, straggler.seconds - straggler.median_s)


def cost_so_far(straggler: Straggler, named_since: Optional[int]) -> Optional[float]:
    """Seconds a CPU straggler has cost the job since the window that first named it began:
    its :func:`loss_rate` now x the steps from that window's first step to its newest judged
    one. None for a link straggler (named only by two probe rounds in a row, its loss the
    job's measured collective rise: :func:`confirm_link_stragglers`) or when no first naming is
    known.

    Why it matters (see :func:`eviction_pays`): a CPU straggler is named on one window of its
    own steps, a fraction of a second at this scale, and a burst of load can be that long. Two
    runs of the straggler drill beside two CPU hogs named a healthy group 1.8x and 2.5x slower
    for 10 and 20 steps (the scheduler had left it sharing a core with a hog while its peers had
    one each), a standby was ready, and ``loss_rate x steps_left`` (18,787 steps) evicted it
    (2026-12-06, docs/results/stress.md "Stop 40").

    Args:
        straggler: the verdict now.
        named_since: the first step of the window that first named it (StragglerWatch.named_since).
    """
    if straggler.kind != SlowKind.CPU or named_since is None:
        return None
    return loss_rate(straggler) * max(0, straggler.steps[1] - named_since + 1)


def eviction_pays(straggler: Straggler, recovery_s: float, steps_left: int) -> bool:
    """Whether evicting ``straggler`` costs the job less than keeping it.

    The rule: keeping it loses :func:`loss_rate` seconds per step for each step left; an
    eviction costs about one recovery, ``recovery_s`` (the survivors stall while the
    Lighthouse drops the group and the standby heals in). Evict when
    ``loss_rate x steps_left > recovery_s``; a job about to end keeps its straggler.

    Args:
        straggler: the verdict.
        recovery_s: seconds a recovery costs the job (the job's own MTTR so far, or ``ft.straggler_recovery_s``).
        steps_left: steps the job still has to train.
    """
    return steps_left > 0 and loss_rate(straggler) * steps_left > recovery_s


__all__ = [
    "LinkProbe",
    "ProbeReason",
    "SlowKind",
    "Straggler",
    "StragglerLimits",
    "StragglerWatch",
    "eviction_pays",
    "back_to_pace",
    "collective_loss",
    "cpu_suspects",
    "find_link_stragglers",
    "find_stragglers",
    "job_pace",
    "probe_due",
    "loss_rate",
]
