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
of load on a shared machine that slows one group for a few steps names nobody. A group's per-step time is its slowest
rank's (inside a group the ranks wait for each other in FSDP's collectives, so all of them look
slow; the slowest is the one named). Machine-wide load slows every group alike: the ratio to the
peers stays near 1 and nobody is flagged.

Collective time cannot be compared as plainly: a group that is waited for spends *less* time in
the allreduce and its peers more (they wait for it there), so a compute straggler makes its
peers look like link stragglers. A link straggler is therefore only named when no group is a
compute straggler and its own compute time is not below its peers' (it is not just waiting).
And a slow link is rarely attributable this way at all: in a ring allreduce every member waits
for the slowest link, so a rate-limited link (``slow_link``) lengthened every group's collective
alike in a drill (1.07-1.24 s each) and named nobody. A link straggler is only reported, never
evicted (RecoveryPlanner.on_straggler).

Eviction (``ft.straggler=evict``) pays when the time the straggler costs the job over the
recovery's own duration exceeds what the recovery costs; see :func:`eviction_pays`.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from monarch_ft.records.events import StrEnum
from monarch_ft.records.reports import compute_seconds


# Windows of steps kept per group (see StragglerWatch.observe).
KEEP_WINDOWS = 10


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
        steps: the window's steps (first, last).
    """

    group: int
    rank: int
    kind: SlowKind
    seconds: float
    median_s: float
    steps: tuple[int, int]

    @property
    def ratio(self) -> float:
        return self.seconds / self.median_s if self.median_s > 0 else float("inf")

    def fields(self) -> dict:
        """The ``straggler_detected`` event's fields."""
        return {
            "group": self.group,
            "rank": self.rank,
            "slow_kind": self.kind.value,
            "seconds": round(self.seconds, 4),
            "median_s": round(self.median_s, 4),
            "ratio": round(self.ratio, 2),
            "steps": list(self.steps),
        }


@dataclass
class GroupTimes:
    """One group's newest steps: step -> (compute seconds, collective seconds) of its slowest
    rank, and which rank that was."""

    attempt: int = -1
    compute: dict[int, float] = field(default_factory=dict)
    collective: dict[int, float] = field(default_factory=dict)
    slowest: dict[int, int] = field(default_factory=dict)

    def trim(self, keep: int) -> None:
        for step in sorted(self.compute)[:-keep]:
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

    def observe(self, rec: dict, window: int) -> None:
        """Take one step record of a rank (its group, rank, attempt, step and timings)."""
        if not rec.get("committed") or rec.get("step_time_s") is None:
            return
        group, rank, attempt = int(rec["group"]), int(rec["rank"]), int(rec.get("attempt") or 0)
        if (group, rank, attempt) not in self.seen:
            self.seen.add((group, rank, attempt))
            return
        times = self.groups.setdefault(group, GroupTimes())
        if attempt != times.attempt:
            if attempt < times.attempt:
                return  # a late record of an attempt already replaced
            times = self.groups[group] = GroupTimes(attempt)
        step = int(rec["step"])
        compute = compute_seconds(rec)
        if compute >= times.compute.get(step, -1.0):
            times.compute[step] = compute
            times.slowest[step] = rank
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


def _median_of(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _by_step(times: Iterable[dict[int, float]]) -> dict[int, list[float]]:
    """Every compared group's time at each step, sorted: built once per judgement, so that
    judging G groups costs G x (steps kept) and not G x G x (steps kept) (each group's peers
    looked up step by step, as it first was: 16 groups spent a tenth of the controller's tick
    there; benchmarks/scale_bench.py)."""
    table: dict[int, list[float]] = {}
    for t in times:
        for step, seconds in t.items():
            table.setdefault(step, []).append(seconds)
    for values in table.values():
        values.sort()
    return table


def _median_without(values: list[float], own: float) -> float:
    """The median of sorted ``values`` with one ``own`` taken out (its peers' median at a step):
    what ``statistics.median`` gives for the list without it, without copying it."""
    i = bisect.bisect_left(values, own)
    n = len(values) - 1

    def at(k: int) -> float:
        return values[k] if k < i else values[k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _slow_steps(own: dict[int, float], table: dict[int, list[float]], limits: StragglerLimits) -> Optional[tuple[list[int], list[float], list[bool]]]:
    """The group's newest ``window`` steps that a peer also reported, the peers' median time
    for each, and whether the group was slow at each; None with fewer such steps.

    Args:
        own: the group's times per step.
        table: every compared group's times per step, the group's own among them (:func:`_by_step`).
        limits: the window, factor and floor.
    """
    aligned = [s for s in sorted(own) if len(table.get(s, ())) > 1][-limits.window :]
    if len(aligned) < limits.window:
        return None
    medians = [_median_without(table[s], own[s]) for s in aligned]
    return aligned, medians, [own[s] > limits.factor * m and own[s] - m > limits.min_excess_s for s, m in zip(aligned, medians)]


def _verdict(own: dict[int, float], table: dict[int, list[float]], limits: StragglerLimits) -> Optional[tuple[float, float, tuple[int, int]]]:
    """(own median, peers' median, (first, last step)) when every one of the group's newest
    ``window`` steps that a peer also reported was slow against the peers' median at that
    same step; None otherwise (or with fewer such steps)."""
    found = _slow_steps(own, table, limits)
    if found is None or not all(found[2]):
        return None
    aligned, medians, _ = found
    return _median_of(own[s] for s in aligned), _median_of(medians), (aligned[0], aligned[-1])


def back_to_pace(watch: "StragglerWatch", group: int, active: Iterable[int], limits: StragglerLimits) -> bool:
    """A group named a straggler is back to its peers' pace: none of its newest ``window``
    steps was slow (a straggler is named on a whole window of slow steps and cleared on a whole
    window of normal ones, so one fast step does not clear it and name it again a step later).
    A group no longer compared (not stepping, or its window restarted) counts as back."""
    active = set(active)
    groups = {g: t for g, t in watch.groups.items() if g in active}
    if group not in groups or len(groups) < 2:
        return True
    if watch.flagged.get(group) == SlowKind.LINK:
        found = _slow_steps(groups[group].collective, _by_step(t.collective for t in groups.values()), limits)
    else:
        found = _slow_steps(groups[group].compute, _by_step(t.compute for t in groups.values()), limits)
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
        The stragglers, compute ones first; [] while fewer than two groups are compared.
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
    compute = _by_step(t.compute for t in groups.values())
    for g in sorted(groups):
        found = _verdict(groups[g].compute, compute, limits)
        if found is not None:
            out.append(straggler(g, SlowKind.CPU, found))
    if out:
        return out
    collective = _by_step(t.collective for t in groups.values())
    for g in sorted(groups):
        found = _verdict(groups[g].collective, collective, limits)
        if found is None:
            continue
        # Not merely waiting for the others: its own compute is not below theirs (a group that
        # computes faster waits longest in the allreduce: a loaded drill named one so, with its
        # compute at 0.7x its peers').
        own_compute = _median_of(list(groups[g].compute.values())[-limits.window :])
        peer_compute = _median_of(v for h in groups if h != g for v in list(groups[h].compute.values())[-limits.window :])
        if own_compute >= peer_compute:
            out.append(straggler(g, SlowKind.LINK, found))
    return out


def loss_rate(straggler: Straggler) -> float:
    """Seconds the job loses per step while the straggler stays: its excess over its peers
    (every group waits for it at each allreduce)."""
    return max(0.0, straggler.seconds - straggler.median_s)


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
    "SlowKind",
    "Straggler",
    "StragglerLimits",
    "StragglerWatch",
    "eviction_pays",
    "back_to_pace",
    "find_stragglers",
    "loss_rate",
]
