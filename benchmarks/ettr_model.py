"""What this toolkit would buy at a user's scale: ETTR and goodput of a job under four ways to recover.

    python benchmarks/ettr_model.py                                   # the recorded phases, 8B and 70B, 1k-100k GPUs
    python benchmarks/ettr_model.py --shapes 70b --gpus 16384,100000 --group-gpus 128
    python benchmarks/ettr_model.py --drill standby=docs/results/drill-standby-three-faults/drill.json
    python benchmarks/ettr_model.py --check /tmp/gp16                 # against a goodput_bench run's cells
    python benchmarks/ettr_model.py --out docs/results/ettr-model     # the table (README rows) and the plot

A model, not a measurement: it prices each failure with the phases this repository measured in its
drills and projects them to a job of ``gpus`` GPUs, cut into replica groups of ``--group-gpus``.

**Inputs** (each a flag; the defaults are the files recorded under ``docs/results/``):

- a drill's measured phases per arm (``drill.json``: ``phases.detected``, ``phases.replacement_up``,
  ``recovery_bytes``/``recovery_seconds`` (the heal's bytes per second), ``back_in_quorum`` less
  ``weights_recovered`` (the rejoin), ``survivor_max_stall_s``), or the same phases aggregated by
  ``recipes/mttr_bench.py`` (``summary.json``, p50 over fault kinds): ``--drill ARM=PATH``;
- the checkpoint save and load times: per GPU, the model's state over ``--ckpt-write-gbps`` and
  ``--ckpt-read-gbps`` (or ``--ckpt-save-s`` / ``--ckpt-load-s`` outright);
- the step time (``--step-s``; per shape by default);
- the failure rate by scale: the job's mean time to failure (MTTF) at a number of GPUs, interpolated
  log-log between the table's points (``--failure-table GPUS:HOURS,...``). **Default: the figures of
  Meta's reliability study** (A. Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
  Research Clusters", HPCA 2025, arXiv:2410.21680, as quoted in issue 34): MTTF about 7.9 h at 1,024
  GPUs, 1.8 h at 16,384 and about 14 min at 131,072.

**Arms**, each failure priced in group-seconds lost (a group of ``--group-gpus`` GPUs):

- ``live_standby``: the failed group's place is taken by a warm standby group; the survivors stall for
  the measured ``survivor_max_stall_s`` (the Lighthouse's heartbeat timeout and the quorum's change),
  the failed group is out for detection + promotion + heal + rejoin. The standby groups
  (``--standby-groups``) are GPUs held idle: goodput charges them.
- ``live_fork``: the same, the replacement forked from the warm fork server of a healthy host; a
  share of failures (``--node-failure-share``) take the host, and then wait ``--node-wait-s`` for the
  scheduler's replacement node first.
- ``full_restart``: every group stops and resumes from the last disk checkpoint, taken every tau
  seconds with tau the Young/Daly optimum ``sqrt(2 delta (M + R)) - delta`` (J. Daly, "A higher
  order estimate of the optimum checkpoint interval for restart dumps", FGCS 2006), delta the save,
  M the MTTF, R the detection + ``--restart-s`` + the load; a failure loses R and half an interval.
- ``no_ft``: the same restart without fault tolerance: a failure is noticed at TorchTitan's collective
  timeout (``--no-ft-detect-s``, its ``comm.train_timeout_seconds`` default 100 s), the job waits for
  the scheduler to requeue it (``--requeue-s``) and checkpoints at a fixed interval (``--no-ft-ckpt-interval-s``).

**Outputs** per shape, scale and arm: **ETTR**, the share of the active groups' time spent in steps
that count (a step-bound job: 1 without failures; the drills' definition, monarch_ft.records.goodput,
less the job's own gaps between steps), and **goodput**, the same share of every GPU the job holds
(spares included): ETTR x groups / (groups + spares).

**Assumptions** (each can be wrong; each is a flag):

- heal time is the model's state per GPU over ``--heal-gbps`` per GPU (every rank of the new group
  receives its shard from its peer at once), the state being ``--state-bytes-per-param`` (fp32
  weights and two Adam moments: 12) times the parameters; the measured heal rate on this machine
  (loopback, CPU) is shown but not used at scale;
- detection, promotion, rejoin and the survivors' stall are the drills' measured seconds, taken as
  independent of scale (the control plane's own growth: docs/results/scale/ and
  docs/design/scale.md);
- failures are independent, one at a time (the MTTF is hours to minutes, a live recovery seconds; a
  second failure during a recovery, or before the standby pool is refilled, is not modelled);
- the job is step-bound: nothing but failures and checkpoints is lost; every group is equal; no
  failure is silent (a silent corruption found late costs a rollback no arm avoids);
- the live arms also checkpoint, for the failures no peer survives, every ``--live-ckpt-interval-s``.

``--check RUN`` compares the model with a ``recipes/goodput_bench.py`` run (its ``goodput.json``: ``summary``
per arm and rate, ``cells`` with each fault's kind): for each arm at each fault rate > 0 it ran, at the
bench's groups and **realised** fault rate, the goodput over the arm's own fault-free cells the model
predicts, ``1 - rate x (group-seconds lost per fault) / groups``, and ETTR (the arm's measured fault-free
ETTR times that ratio: the model prices faults, not a short cell's start-up), beside the bench's mean and
95% interval. Each fault is priced by its kind: an aborted collective recovers in place (every group
stalls 0.134 s, no relaunch); a kind the recorded sweep has for the arm by its phases there (in place if it
relaunched nothing); any other by the arm's recorded phases. Bench arms map to model arms: ``live_standby``
and ``diloco_standby`` (the model has no DiLoCo arm: priced as a live standby, said on the page) to
``live_standby``, ``live`` to ``live_fork``, ``full_restart`` to itself; any other arm gets a line saying it
is not modelled. Where the run directory still holds every cell's drill.json, the cells' own phases price
them too. The goodput.json of the bench before its rework (cells with ``ratio``) is refused in one line.

**Stated error** (``--check``'s band, ``[lo, hi]`` beside each prediction): the spread of the recorded
phases, propagated. A drill's phases are priced at their min and max over its relaunched faults; a sweep's
(mttr_bench summary.json, which records p50 and p95 per kind) at its p95 and at the p50 mirrored below it
(``2 p50 - p95``, at least 0), the survivors' stall at its max and its mean mirrored likewise; each fault
priced at the low ends and at the high ends gives the band's two ends. The aborted collective's stall is
one recorded fault: no spread. Not in the band: the bench's own noise (its interval, set beside it), and
what the model leaves out (overlapping faults, a fault never recovered). A prediction **agrees** when it
lies in the measured 95% interval widened by the band (equivalently: band and interval overlap); below 3
repetitions the bench gives no interval, and the measured point stands for it.

Ends with one line: ``ettr_<shape>_<gpus>_<arm>=…`` for the largest scale of the first shape.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ARMS = ("live_standby", "live_fork", "full_restart", "no_ft")
SCALES = (1024, 4096, 16384, 32768, 100000)
# (GPUs, MTTF seconds): Kokolis et al., HPCA 2025 (arXiv:2410.21680), as quoted in issue 34.
FAILURE_TABLE = ((1024, 7.9 * 3600.0), (16384, 1.8 * 3600.0), (131072, 14.0 * 60.0))
# The recorded drills each live arm's phases default to (docs/results/).
RECORDED = {
    "live_standby": "docs/results/drill-standby-three-faults/drill.json",
    "live_fork": "docs/results/mttr-sweep-standby-fork-full-restart/summary.json",
    "full_restart": "docs/results/mttr-sweep-standby-fork-full-restart/summary.json",
}
# A sweep summary's name for each arm (recipes/mttr_bench.py).
SUMMARY_ARM = {"live_standby": "live+standby", "live_fork": "live+fork", "full_restart": "full_restart"}
GB = 1e9


@dataclass(frozen=True)
class Phases:
    """One arm's measured recovery, in seconds (a drill's phases, averaged over its faults).

    Args:
        detect_s: fault to detection.
        up_s: detection to the replacement's processes up (promoted, forked, relaunched).
        heal_s: the weights' transfer (``recovery_seconds``); 0 where none was measured.
        heal_bytes: the bytes it moved (``recovery_bytes``).
        rejoin_s: weights recovered to back in the quorum.
        stall_s: the survivors' longest stall.
        mttr_s: fault to back in the quorum.
        source: where they were read.
    """

    detect_s: float
    up_s: float
    heal_s: float
    heal_bytes: float
    rejoin_s: float
    stall_s: float
    mttr_s: float
    source: str = ""

    @property
    def heal_gbps(self) -> Optional[float]:
        """The measured heal rate (GB/s), None where no heal was measured."""
        return self.heal_bytes / self.heal_s / GB if self.heal_s > 0 and self.heal_bytes > 0 else None


@dataclass(frozen=True)
class Shape:
    """A model and how it is cut.

    Args:
        name: its label.
        params: parameters.
        group_gpus: GPUs per replica group (one whole copy of the model's state).
        step_s: seconds per step (assumed: an order of magnitude for the shape on current GPUs).
    """

    name: str
    params: float
    group_gpus: int
    step_s: float


SHAPES = {
    "8b": Shape("8b", 8.0e9, 8, 1.0),
    "70b": Shape("70b", 70.6e9, 64, 3.0),
}


@dataclass(frozen=True)
class Assumptions:
    """The model's stated assumptions (see the module doc); each is a command-line flag."""

    state_bytes_per_param: float = 12.0
    heal_gbps: float = 25.0
    ckpt_write_gbps: float = 2.0
    ckpt_read_gbps: float = 4.0
    ckpt_save_s: Optional[float] = None
    ckpt_load_s: Optional[float] = None
    restart_s: float = 300.0
    no_ft_detect_s: float = 100.0
    requeue_s: float = 600.0
    no_ft_ckpt_interval_s: float = 3600.0
    live_ckpt_interval_s: float = 3600.0
    standby_groups: int = 1
    node_failure_share: float = 0.5
    node_wait_s: float = 120.0


@dataclass
class Row:
    """One projected cell: a shape at a scale under an arm."""

    shape: str
    gpus: int
    groups: int
    arm: str
    mttf_h: float
    ettr: float
    goodput: float
    lost_per_failure_s: float
    ckpt_interval_s: Optional[float] = None
    notes: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- failures
def mttf_s(gpus: float, table: tuple[tuple[float, float], ...] = FAILURE_TABLE) -> float:
    """The job's MTTF at ``gpus``, log-log between the table's points (extrapolated from the nearest two).

    Args:
        gpus: the job's GPUs.
        table: (GPUs, MTTF seconds) points, at least two.
    """
    pts = sorted(table)
    if len(pts) < 2:
        raise ValueError("the failure table needs at least two (GPUs, MTTF) points")
    lo, hi = pts[0], pts[1]
    for a, b in zip(pts, pts[1:]):
        lo, hi = a, b
        if gpus <= b[0]:
            break
    slope = math.log(hi[1] / lo[1]) / math.log(hi[0] / lo[0])
    return lo[1] * (gpus / lo[0]) ** slope


def daly_interval(save_s: float, mttf: float, restart_s: float) -> float:
    """Daly's first-order optimum checkpoint interval (compute seconds between two saves).

    Args:
        save_s: one save's blocking seconds (delta).
        mttf: the job's mean time to failure (M).
        restart_s: a failure's restart, to the first step after it (R).
    """
    if save_s <= 0:
        return float("inf")
    if save_s >= 2 * mttf:
        return mttf
    return math.sqrt(2.0 * save_s * (mttf + restart_s)) - save_s


# ---------------------------------------------------------------- the measured phases
def read_phases(path: str, arm: str) -> Phases:
    """An arm's phases from a drill's ``drill.json`` (its recovered faults' mean) or an
    ``mttr_bench`` ``summary.json`` (the arm's p50 per kind, averaged over kinds).

    Args:
        path: the file.
        arm: one of :data:`ARMS` (a summary's own name for it: :data:`SUMMARY_ARM`).
    """
    with open(path) as f:
        data = json.load(f)
    if "faults" in data:
        faults = [f for f in data["faults"] if f.get("recovered") and (f.get("phases") or {}).get("replacement_up") is not None]
        if not faults:
            raise ValueError(f"{path}: no recovered fault with a replacement in it: not the drill of a relaunch")

        def mean(values: list[float]) -> float:
            values = [v for v in values if v is not None]
            return sum(values) / len(values) if values else 0.0

        ph = [f["phases"] for f in faults]
        return Phases(
            detect_s=mean([p["detected"] for p in ph]),
            up_s=mean([p["replacement_up"] - p["detected"] for p in ph]),
            heal_s=mean([f.get("recovery_seconds") for f in faults]),
            heal_bytes=mean([f.get("recovery_bytes") for f in faults]),
            rejoin_s=mean([p["back_in_quorum"] - p["weights_recovered"] for p in ph if p.get("weights_recovered") is not None]),
            stall_s=mean([f.get("survivor_max_stall_s") for f in faults]),
            mttr_s=mean([f["mttr_s"] for f in faults]),
            source=os.path.relpath(path, REPO) if os.path.isabs(path) else path,
        )
    stats = data.get("stats")
    if not stats:
        raise ValueError(f"{path}: neither a drill.json (faults) nor an mttr_bench summary.json (stats)")
    name = SUMMARY_ARM.get(arm, arm)
    # The kinds that relaunched a replacement (an aborted collective recovers in place).
    kinds = [k for k in stats if name in stats[k] and stats[k][name]["phases"]["replacement_up"]["p50"] is not None]
    if not kinds:
        raise ValueError(f"{path}: no '{name}' recovery with a replacement in it")

    def p50(kind: str, phase: str) -> float:
        return stats[kind][name]["phases"][phase]["p50"]

    def avg(fn) -> float:
        return sum(fn(k) for k in kinds) / len(kinds)

    return Phases(
        detect_s=avg(lambda k: p50(k, "detected")),
        up_s=avg(lambda k: p50(k, "replacement_up") - p50(k, "detected")),
        heal_s=0.0,
        heal_bytes=0.0,
        rejoin_s=avg(lambda k: p50(k, "back_in_quorum") - p50(k, "weights_recovered")),
        stall_s=avg(lambda k: stats[k][name]["survivor_max_stall_s"]["mean"]),
        mttr_s=avg(lambda k: stats[k][name]["mttr"]["p50"]),
        source=os.path.relpath(path, REPO) if os.path.isabs(path) else path,
    )


def recorded_phases(overrides: Optional[dict[str, str]] = None) -> dict[str, Phases]:
    """Each arm's phases, from :data:`RECORDED` unless ``overrides`` names another file.

    Args:
        overrides: arm -> path.
    """
    paths = {**RECORDED, **(overrides or {})}
    return {arm: read_phases(p if os.path.isabs(p) else os.path.join(REPO, p), arm) for arm, p in paths.items()}


# ---------------------------------------------------------------- the model
def state_bytes(shape: Shape, a: Assumptions) -> float:
    return shape.params * a.state_bytes_per_param


def checkpoint_times(shape: Shape, a: Assumptions) -> tuple[float, float]:
    """(save, load) seconds: every GPU writes or reads its shard at once."""
    per_gpu = state_bytes(shape, a) / shape.group_gpus
    save = a.ckpt_save_s if a.ckpt_save_s is not None else per_gpu / (a.ckpt_write_gbps * GB)
    load = a.ckpt_load_s if a.ckpt_load_s is not None else per_gpu / (a.ckpt_read_gbps * GB)
    return save, load


def live_loss(groups: int, ph: Phases, heal_s: float, up_extra_s: float = 0.0) -> float:
    """Group-seconds one failure costs a live recovery: the survivors' stall, and the failed group
    out from the fault to back in the quorum.

    Args:
        groups: active groups.
        ph: the arm's measured phases.
        heal_s: the weights' transfer for this shape.
        up_extra_s: waited before the replacement starts (a node from the scheduler).
    """
    out = ph.detect_s + up_extra_s + ph.up_s + heal_s + ph.rejoin_s
    return (groups - 1) * ph.stall_s + out


def project(shape: Shape, gpus: int, arm: str, phases: dict[str, Phases], a: Assumptions, table=FAILURE_TABLE) -> Row:
    """One shape at one scale under one arm (see the module doc for the accounting).

    Args:
        shape: the model and its group size.
        gpus: the job's GPUs (active groups x group GPUs; spares are on top).
        arm: one of :data:`ARMS`.
        phases: the measured phases per live arm and full restart (:func:`recorded_phases`).
        a: the assumptions.
        table: the failure table.
    """
    groups = max(1, gpus // shape.group_gpus)
    mttf = mttf_s(gpus, table)
    rate = 1.0 / mttf
    save_s, load_s = checkpoint_times(shape, a)
    heal_s = state_bytes(shape, a) / shape.group_gpus / (a.heal_gbps * GB)
    notes: dict[str, Any] = {"save_s": round(save_s, 1), "load_s": round(load_s, 1), "heal_s": round(heal_s, 2)}
    if arm in ("live_standby", "live_fork"):
        ph = phases[arm]
        if arm == "live_standby":
            lost = live_loss(groups, ph, heal_s)
            spares = a.standby_groups
        else:
            lost = (1 - a.node_failure_share) * live_loss(groups, ph, heal_s) + a.node_failure_share * live_loss(groups, ph, heal_s, a.node_wait_s)
            spares = 0
        lost += shape.step_s  # the failed group's step in flight
        ckpt = save_s / (a.live_ckpt_interval_s + save_s)
        ettr = max(0.0, (1.0 - rate * lost / groups) * (1.0 - ckpt))
        return Row(shape.name, gpus, groups, arm, mttf / 3600, ettr, ettr * groups / (groups + spares), lost / groups, a.live_ckpt_interval_s, notes)
    if arm == "full_restart":
        restart = phases["full_restart"].detect_s + a.restart_s + load_s
        tau = max(shape.step_s, daly_interval(save_s, mttf, restart))
    elif arm == "no_ft":
        restart = a.no_ft_detect_s + a.requeue_s + a.restart_s + load_s
        tau = a.no_ft_ckpt_interval_s
    else:
        raise ValueError(f"unknown arm {arm!r}: choose among {', '.join(ARMS)}")
    # Per failure: the restart and, on average, half an interval of work (and its saves) redone.
    lost = restart + (tau + save_s) / 2.0
    ettr = max(0.0, (1.0 - lost / mttf) * tau / (tau + save_s))
    return Row(shape.name, gpus, groups, arm, mttf / 3600, ettr, ettr, lost, tau, notes)


def table(shapes: list[Shape], scales: list[int], arms: list[str], phases: dict[str, Phases], a: Assumptions, failure_table=FAILURE_TABLE) -> list[Row]:
    return [project(s, g, arm, phases, a, failure_table) for s in shapes for g in scales for arm in arms]


# ---------------------------------------------------------------- against the goodput bench
# An aborted collective recovers in place (no relaunch, in every arm): every group stalls about this
# long (docs/results/drill-every-fault-kind/drill.json: 0.134 s, one fault: no spread recorded).
ABORTED_COLLECTIVE_STALL_S = 0.134
# The kinds that abort a collective (chaos/kinds/collective.py: mode ``abort`` is the default).
ABORTED_COLLECTIVE = ("collective", "collective:abort")
# Each goodput_bench arm (chaos/goodput.py: ARMS) -> the model arm that prices it, and what that costs in truth.
BENCH_ARM: dict[str, tuple[str, str]] = {
    "live_standby": ("live_standby", ""),
    "live": ("live_fork", ""),
    "full_restart": ("full_restart", ""),
    "diloco_standby": (
        "live_standby",
        "the model has no DiLoCo arm: priced as live_standby (survivors stalled, the failed group out for its MTTR), not as DiLoCo's lost unsynced window",
    ),
}
# The bench's plain no-FT training: fault-free only, no row to check.
BENCH_NOFT = "noft"


class BenchFormatError(ValueError):
    """A goodput.json ``--check`` cannot read: the message names the file and the fix."""


@dataclass(frozen=True)
class Band:
    """A prediction with the model's stated error: ``value`` from the inputs' middles, ``lo``/``hi``
    from their low and high ends (see the module doc)."""

    value: float
    lo: float
    hi: float

    def text(self, digits: int = 3) -> str:
        return f"{self.value:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


# Phases' figures (every field but its source): what a band takes the min, max or mean of.
PHASE_FIGURES = ("detect_s", "up_s", "heal_s", "heal_bytes", "rejoin_s", "stall_s", "mttr_s")


def _spread(mid: float, hi: float, end: str) -> float:
    """A recorded figure at one end of its band: ``mid``, ``hi``, or ``mid`` mirrored below (``lo``:
    ``2 mid - hi``, at least 0; the sweep records no low percentile)."""
    return {"mid": mid, "hi": hi, "lo": max(0.0, 2 * mid - hi)}[end]


def phase_band(path: str, arm: str, kind: Optional[str] = None) -> Optional[tuple[Phases, Phases, Phases]]:
    """(low, middle, high) phases of ``arm`` from a drill.json or an mttr_bench summary.json.

    A drill: the middle is :func:`read_phases`' mean, low and high each phase's min and max over the
    recovered faults. A summary: the middle is the p50 (the survivors' stall: its mean), high the p95
    (the stall: its max), low the p50 mirrored below (``2 p50 - p95``, at least 0: the sweep records no
    low percentile); over the kinds that relaunched, averaged, or of one ``kind`` alone. None: no
    ``kind`` for the arm in a summary (or a ``kind`` asked of a drill).

    Args:
        path: the file.
        arm: a model arm (:data:`ARMS`).
        kind: one fault kind (summaries only; a drill's band is over its faults whatever their kind).
    """
    with open(path) as f:
        data = json.load(f)
    source = os.path.relpath(path, REPO) if os.path.isabs(path) else path
    if "faults" in data:
        if kind is not None:
            return None
        mid = read_phases(path, arm)
        faults = [f for f in data["faults"] if f.get("recovered") and (f.get("phases") or {}).get("replacement_up") is not None]
        each = [own_phases(f) for f in faults]
        lo = Phases(*(min(getattr(p, k) for p in each) for k in PHASE_FIGURES), source)
        hi = Phases(*(max(getattr(p, k) for p in each) for k in PHASE_FIGURES), source)
        return lo, mid, hi
    stats = data.get("stats") or {}
    name = SUMMARY_ARM.get(arm, arm)
    if kind is not None:
        kinds = [kind] if name in (stats.get(kind) or {}) else []
    else:
        kinds = [k for k in stats if name in stats[k] and stats[k][name]["phases"]["replacement_up"]["p50"] is not None]
    if not kinds:
        return None

    def one(k: str, end: str) -> Phases:
        e = stats[k][name]
        p = e["phases"]

        def at(phase: str) -> Optional[float]:
            q = p[phase]
            if q["p50"] is None:
                return None
            return _spread(q["p50"], q["p95"], end)

        st, m = e["survivor_max_stall_s"], e["mttr"]
        stall, mttr = _spread(st["mean"], st["max"], end), _spread(m["p50"], m["p95"], end)
        det, up = at("detected") or 0.0, at("replacement_up")
        rec, back = at("weights_recovered"), at("back_in_quorum")
        rejoin = max(0.0, back - rec) if back is not None and rec is not None else 0.0
        return Phases(det, max(0.0, up - det) if up is not None else 0.0, 0.0, 0.0, rejoin, stall, mttr, source)

    def avg(end: str) -> Phases:
        each = [one(k, end) for k in kinds]
        return Phases(*(sum(getattr(p, k) for p in each) / len(each) for k in PHASE_FIGURES), source)

    return avg("lo"), avg("mid"), avg("hi")


def relaunches(path: str, arm: str, kind: str) -> bool:
    """The summary's ``kind`` relaunched a replacement in ``arm`` (False: it recovered in place)."""
    with open(path) as f:
        entry = ((json.load(f).get("stats") or {}).get(kind) or {}).get(SUMMARY_ARM.get(arm, arm)) or {}
    return ((entry.get("phases") or {}).get("replacement_up") or {}).get("p50") is not None


def fault_kind(fault: dict) -> str:
    """A drill fault's kind as the sweep summaries name it (``hang:gil``, ``collective:hang``)."""
    return f"{fault['kind']}:{fault['mode']}" if fault.get("mode") else fault["kind"]


def fault_loss(arm: str, groups: int, in_place: bool, ph: Phases, step_s: float, ckpt_interval_steps: int) -> float:
    """Group-seconds one fault costs a goodput_bench cell of ``groups`` groups.

    Args:
        arm: the model arm pricing it (:data:`BENCH_ARM`'s).
        groups: the job's groups.
        in_place: the fault recovers in place (an aborted collective; a kind the sweep saw relaunch
            nothing): every group stalls ``ph.stall_s``, nothing relaunches, in every arm.
        ph: the phases that price it.
        step_s: the arm's fault-free step time.
        ckpt_interval_steps: ``checkpoint.interval`` (a full restart redoes half of it on average).
    """
    if in_place:
        return groups * ph.stall_s
    if arm == "full_restart":
        return groups * (ph.mttr_s + ckpt_interval_steps * step_s / 2.0)
    return (groups - 1) * ph.stall_s + ph.mttr_s + step_s


def own_phases(fault: dict) -> Phases:
    """One measured fault's own phases (a cell's drill.json)."""
    p = fault.get("phases") or {}
    up = p.get("replacement_up")
    det = p.get("detected") or 0.0
    rec, back = p.get("weights_recovered"), p.get("back_in_quorum")
    return Phases(
        det,
        (up - det) if up is not None else 0.0,
        fault.get("recovery_seconds") or 0.0,
        fault.get("recovery_bytes") or 0.0,
        (back - rec) if back is not None and rec is not None else 0.0,
        fault.get("survivor_max_stall_s") or 0.0,
        fault.get("mttr_s") or 0.0,
    )


def read_bench(run: str) -> tuple[str, dict]:
    """The path and contents of a goodput_bench run's goodput.json (BenchFormatError: one line, the fix)."""
    path = run if run.endswith(".json") else os.path.join(run, "goodput.json")
    fix = "give a monarch-ft goodput-bench run directory or its goodput.json"
    try:
        with open(path) as f:
            bench = json.load(f)
    except OSError as e:
        raise BenchFormatError(f"cannot read {path}: {e.strerror or e}: {fix}") from None
    except ValueError as e:
        raise BenchFormatError(f"{path} is not JSON ({e}): {fix}") from None
    if not isinstance(bench, dict):
        raise BenchFormatError(f"{path}: not a goodput_bench goodput.json (no 'summary' and 'cells'): {fix}")
    cells = bench.get("cells")
    if "summary" not in bench and isinstance(cells, list) and cells and isinstance(cells[0], dict) and "ratio" in cells[0]:
        raise BenchFormatError(
            f"{path} is the goodput bench's format from before its rework (cells with 'ratio', no 'summary'): rerun monarch-ft goodput-bench and check that run"
        )
    missing = [k for k in ("groups", "summary", "cells") if k not in bench]
    if missing or not isinstance(bench["summary"], list) or not isinstance(cells, list):
        raise BenchFormatError(f"{path}: not a goodput_bench goodput.json (missing {', '.join(missing) or 'lists'}): {fix}")
    return path, bench


def check(run: str, phases: dict[str, Phases], ckpt_interval_steps: int, summary: Optional[str] = None) -> list[dict[str, Any]]:
    """Each (arm, fault rate) a goodput_bench run measured beside the model's prediction at the same
    groups and realised fault rate: the goodput over the arm's own fault-free cells, and ETTR (the
    arm's measured fault-free ETTR times that ratio: the model prices the faults, not a short cell's
    start-up), each with the model's band (:class:`Band`) and whether it agrees with the measured
    mean's 95% interval widened by that band (they overlap).

    Faults are priced by kind (the cells' ``faults`` list each one): an aborted collective recovers in
    place (every group stalls :data:`ABORTED_COLLECTIVE_STALL_S`); a kind ``summary`` has for the arm
    by its phases there (in place if it relaunched nothing); any other by the arm's recorded phases.
    Where the run directory still holds every cell's drill.json, the cells' own phases price them too.

    Args:
        run: the run directory (or its ``goodput.json``).
        phases: the recorded phases per model arm (the fallback for a kind the summary lacks).
        ckpt_interval_steps: the cells' ``checkpoint.interval``.
        summary: an mttr_bench summary.json with phases per kind (default: the recorded sweep).

    Raises:
        BenchFormatError: the file cannot be read or is not the bench's goodput.json.
    """
    summary = summary or os.path.join(REPO, RECORDED["live_fork"])
    path, bench = read_bench(run)
    try:
        return _check_rows(path, bench, phases, ckpt_interval_steps, summary)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        why = f"{type(e).__name__}: {e}"
        raise BenchFormatError(f"{path}: not the goodput bench's goodput.json as this model reads it ({why}): rerun monarch-ft goodput-bench") from None


def _estimate(e: Optional[dict]) -> dict[str, Any]:
    e = e or {}
    return {"value": e.get("value"), "lo": e.get("lo"), "hi": e.get("hi"), "n": e.get("n", 0)}


def agrees(pred: Band, measured: dict[str, Any]) -> Optional[bool]:
    """The prediction lies in the measured 95% interval widened by the model's band (the two overlap);
    below 3 repetitions the bench gives no interval, and the measured point stands for it. None:
    nothing measured."""
    if measured["value"] is None:
        return None
    lo = measured["lo"] if measured["lo"] is not None else measured["value"]
    hi = measured["hi"] if measured["hi"] is not None else measured["value"]
    return pred.lo <= hi and pred.hi >= lo


def _check_rows(path: str, bench: dict, phases: dict[str, Phases], ckpt_interval_steps: int, summary: str) -> list[dict[str, Any]]:
    folder = os.path.dirname(path)
    groups = int(bench["groups"])
    cells = bench["cells"]
    fault_free = {s["arm"]: s for s in bench["summary"] if s["rate_per_min"] == 0}
    bands: dict[tuple[str, Optional[str]], Optional[tuple[Phases, Phases, Phases]]] = {}

    def band_of(model_arm: str, kind: Optional[str]) -> Optional[tuple[Phases, Phases, Phases]]:
        if (model_arm, kind) not in bands:
            if kind is None:
                # The arm's recorded phases (their file's spread; a point where none is known).
                recorded = phases[model_arm]
                src = recorded.source and (recorded.source if os.path.isabs(recorded.source) else os.path.join(REPO, recorded.source))
                found = phase_band(src, model_arm) if src and os.path.exists(src) else None
                bands[(model_arm, kind)] = found or (recorded, recorded, recorded)
            else:
                bands[(model_arm, kind)] = phase_band(summary, model_arm, kind)
        return bands[(model_arm, kind)]

    out = []
    for s in bench["summary"]:
        arm, rate = s["arm"], float(s["rate_per_min"])
        if arm == BENCH_NOFT or rate <= 0:
            continue
        mine = [c for c in cells if c["arm"] == arm and float(c["rate_per_min"]) == rate]
        faults = [f for c in mine for f in c.get("faults") or [] if f.get("injected")]
        row: dict[str, Any] = {
            "arm": arm,
            "rate_per_min": rate,
            "realised_rate_per_min": s.get("realised_rate"),
            "groups": groups,
            "cells": len(mine),
            "faults": len(faults),
            "not_recovered": sum(1 for f in faults if not f.get("recovered")),
            "kinds": [f["kind"] for f in faults],
            "measured_goodput": _estimate(s.get("goodput")),
            "measured_ettr": _estimate(s.get("ettr")),
        }
        if arm not in BENCH_ARM:
            row["model_arm"] = None
            row["note"] = f"the model has no arm for {arm!r} (it models {', '.join(BENCH_ARM)})"
            out.append(row)
            continue
        model_arm, note = BENCH_ARM[arm]
        row["model_arm"], row["note"] = model_arm, note
        paces = sorted(c["median_step_s"] for c in cells if c["arm"] == arm and float(c["rate_per_min"]) == 0 and c.get("median_step_s") is not None)
        step_s = paces[len(paces) // 2] if paces else 0.0
        # Group-seconds lost per fault, low / middle / high, each fault by its kind.
        losses = []
        for f in faults:
            kind = f["kind"]
            if kind in ABORTED_COLLECTIVE:
                ph = Phases(0.0, 0.0, 0.0, 0.0, 0.0, ABORTED_COLLECTIVE_STALL_S, ABORTED_COLLECTIVE_STALL_S, "drill-every-fault-kind")
                trio, in_place = (ph, ph, ph), True
            else:
                trio = band_of(model_arm, kind)
                in_place = trio is not None and not relaunches(summary, model_arm, kind)
                trio = trio or band_of(model_arm, None)
            losses.append([fault_loss(model_arm, groups, in_place, p, step_s, ckpt_interval_steps) for p in trio])
        realised = s.get("realised_rate") or 0.0

        def ratio(i: int) -> float:
            if not losses:
                return 1.0
            per_fault = sum(x[i] for x in losses) / len(losses)
            return max(0.0, 1.0 - realised / 60.0 * per_fault / groups)

        pred = Band(ratio(1), ratio(2), ratio(0))
        row["step_s"] = step_s
        row["lost_per_fault_group_s"] = [sum(x[i] for x in losses) / len(losses) if losses else 0.0 for i in range(3)]
        row["predicted_goodput"] = asdict(pred)
        row["goodput_agrees"] = agrees(pred, row["measured_goodput"])
        ff = (fault_free.get(arm) or {}).get("ettr") or {}
        if ff.get("value") is not None:
            e = Band(ff["value"] * pred.value, ff["value"] * pred.lo, ff["value"] * pred.hi)
            row["fault_free_ettr"] = ff["value"]
            row["predicted_ettr"] = asdict(e)
            row["ettr_agrees"] = agrees(e, row["measured_ettr"])
        own = [_cell_drill(folder, c) for c in mine]
        if mine and all(own):
            seconds = 0.0
            lost = 0.0
            for c, d in zip(mine, own):
                with open(d) as fh:
                    drilled = [x for x in json.load(fh)["faults"] if x.get("injected") and (x.get("at_s") or 0) < 1e8]
                for x in drilled:
                    in_place = (x.get("phases") or {}).get("replacement_up") is None
                    lost += fault_loss(model_arm, groups, in_place, own_phases(x), step_s, ckpt_interval_steps)
                seconds += c.get("training_s") or 0.0
            row["predicted_goodput_own_phases"] = max(0.0, 1.0 - lost / (groups * seconds)) if seconds else None
        out.append(row)
    return out


def _cell_drill(folder: str, cell: dict) -> Optional[str]:
    """The cell's own drill.json (goodput_bench names a cell's run directory NN-ARM-RATEpm-rREP)."""
    import glob

    pattern = f"[0-9][0-9]-{cell['arm']}-{float(cell['rate_per_min']):g}pm-r{cell.get('repetition', 0)}"
    found = sorted(glob.glob(os.path.join(folder, pattern, "drill.json")))
    return found[0] if found else None


def check_table(rows: list[dict[str, Any]]) -> str:
    """The check's rows as a Markdown table, an unmodelled arm as its own line after it."""

    def measured(m: dict[str, Any]) -> str:
        if m["value"] is None:
            return "n/a"
        ci = f"[{m['lo']:.3f}, {m['hi']:.3f}]" if m["lo"] is not None else "(no interval)"
        return f"{m['value']:.3f} {ci} n={m['n']}"

    def verdict(ok: Optional[bool], m: dict[str, Any]) -> str:
        if ok is None:
            return "n/a"
        word = "inside" if ok else "**outside**"
        return word + (" (the point: n < 3)" if m["lo"] is None else "")

    lines = [
        "| arm | priced as | faults/min: scheduled, realised | groups | faults injected (kinds) "
        "| goodput / own fault-free: measured [95% CI] | predicted [model band] | agrees "
        "| ETTR: measured [95% CI] | predicted [model band] | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        realised = "n/a" if r["realised_rate_per_min"] is None else f"{r['realised_rate_per_min']:.2f}"
        kinds = ", ".join(r["kinds"])
        failed = f"; {r['not_recovered']} not recovered" if r["not_recovered"] else ""
        head = f"| {r['arm']} | {r['model_arm'] or '-'} | {r['rate_per_min']:g}, {realised} | {r['groups']} | {r['faults']} ({kinds}{failed}) "
        if r["model_arm"] is None:
            lines.append(head + f"| {measured(r['measured_goodput'])} | not modelled | - | {measured(r['measured_ettr'])} | not modelled | - |")
            notes.append(f"{r['arm']}: {r['note']}")
            continue
        g = Band(**r["predicted_goodput"])
        e = r.get("predicted_ettr")
        ettr = f"{Band(**e).text()} | {verdict(r.get('ettr_agrees'), r['measured_ettr'])}" if e else "n/a (no fault-free ETTR) | n/a"
        lines.append(
            head + f"| {measured(r['measured_goodput'])} | {g.text()} | {verdict(r['goodput_agrees'], r['measured_goodput'])} "
            f"| {measured(r['measured_ettr'])} | {ettr} |"
        )
        if r["note"]:
            notes.append(f"{r['arm']}: {r['note']}")
    text = "\n".join(lines)
    for n in dict.fromkeys(notes):
        text += f"\n{n}"
    return text


# ---------------------------------------------------------------- output
def markdown(rows: list[Row]) -> str:
    lines = [
        "| shape | GPUs | groups | MTTF (h) | arm | ETTR | goodput | job-seconds lost per failure | checkpoint every (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        every = "" if r.ckpt_interval_s is None else f"{r.ckpt_interval_s:.0f}"
        lines.append(
            f"| {r.shape} | {r.gpus} | {r.groups} | {r.mttf_h:.2f} | {r.arm} | {r.ettr:.4f} | {r.goodput:.4f} | {r.lost_per_failure_s:.1f} | {every} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r.shape for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for arm in ARMS:
            pts = [(r.gpus, r.goodput) for r in rows if r.shape == shape and r.arm == arm]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm)
        ax.set_xscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("goodput (share of GPU time in steps that count)")
        ax.set_title(f"{shape}: {next(r.groups for r in rows if r.shape == shape)} groups at the smallest scale")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def git_commit() -> str:
    from monarch_ft.records.provenance import git_commit as commit_of

    return commit_of(REPO)


def fail(msg: str) -> None:
    print(f"monarch_ft: error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    d = Assumptions()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8b,70b", help=f"model shapes, of {', '.join(SHAPES)} (default 8b,70b)")
    ap.add_argument("--gpus", default=",".join(str(s) for s in SCALES), help="job sizes in GPUs (default 1024,4096,16384,32768,100000)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"arms, of {', '.join(ARMS)}")
    ap.add_argument("--group-gpus", type=int, default=None, help="GPUs per replica group (default: the shape's, 8 for 8b, 64 for 70b)")
    ap.add_argument("--step-s", type=float, default=None, help="seconds per step (default: the shape's, 1 s for 8b, 3 s for 70b)")
    ap.add_argument("--drill", action="append", default=[], metavar="ARM=PATH", help="an arm's phases from this drill.json or mttr_bench summary.json")
    ap.add_argument("--failure-table", default=None, metavar="GPUS:HOURS,...", help="the job's MTTF by scale (default: Kokolis et al. 2025)")
    for name, value in asdict(d).items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(value) if value is not None else float, default=value, help=f"assumption (default {value})")
    ap.add_argument("--check", default=None, metavar="RUN", help="compare with a goodput_bench run (its directory or goodput.json)")
    ap.add_argument("--check-ckpt-interval", type=int, default=10, help="checkpoint.interval of the checked cells (the drill job's: 10)")
    ap.add_argument("--out", default=None, help="write table.md, rows.json and ettr.png there")
    args = ap.parse_args(argv)
    return args


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    try:
        shapes = [SHAPES[s.strip().lower()] for s in args.shapes.split(",") if s.strip()]
    except KeyError as e:
        fail(f"--shapes: unknown shape {e}: choose among {', '.join(SHAPES)}")
    try:
        scales = [int(float(g)) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        fail(f"--gpus={args.gpus}: give comma-separated GPU counts, e.g. 1024,16384")
    arms = [x.strip() for x in args.arms.split(",") if x.strip()]
    if not shapes or not scales or not arms or min(scales) < 1 or any(x not in ARMS for x in arms):
        fail(f"give at least one shape, one GPU count >= 1 and arms among {', '.join(ARMS)}")
    if args.group_gpus is not None or args.step_s is not None:
        shapes = [replace(s, group_gpus=args.group_gpus or s.group_gpus, step_s=args.step_s or s.step_s) for s in shapes]
    if any(s.group_gpus < 1 or s.step_s <= 0 for s in shapes):
        fail("--group-gpus must be >= 1 and --step-s > 0")
    overrides = {}
    for spec in args.drill:
        arm, _, path = spec.partition("=")
        if arm not in RECORDED or not path:
            fail(f"--drill {spec}: give ARM=PATH with ARM among {', '.join(RECORDED)}")
        overrides[arm] = path
    failure_table = FAILURE_TABLE
    if args.failure_table:
        try:
            failure_table = tuple((float(g), float(h) * 3600.0) for g, h in (p.split(":") for p in args.failure_table.split(",")))
        except ValueError:
            fail(f"--failure-table={args.failure_table}: give GPUS:HOURS pairs, e.g. 1024:7.9,16384:1.8")
        if len(failure_table) < 2 or min(h for _, h in failure_table) <= 0:
            fail("--failure-table: give at least two points with MTTF > 0")
    try:
        phases = recorded_phases(overrides)
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read the measured phases: {e}: give --drill ARM=PATH of a drill.json")
    a = Assumptions(**{k: getattr(args, k) for k in asdict(Assumptions())})
    print("measured phases (s):")
    for arm, ph in phases.items():
        rate = f", heal {ph.heal_gbps:.3f} GB/s" if ph.heal_gbps else ""
        print(
            f"  {arm}: detect {ph.detect_s:.3f}, up {ph.up_s:.3f}, heal {ph.heal_s:.3f}, rejoin {ph.rejoin_s:.3f}, "
            f"survivors' stall {ph.stall_s:.3f}, MTTR {ph.mttr_s:.3f}{rate} ({ph.source})"
        )
    if args.check:
        try:
            rows = check(args.check, phases, args.check_ckpt_interval)
        except BenchFormatError as e:
            fail(f"--check: {e}")
        except (OSError, ValueError, KeyError) as e:
            fail(f"--check {args.check}: cannot read the recorded phases: {e}")
        print(
            "model band: each fault priced with its phases' low and high ends (a drill's min and max over its faults; "
            "a sweep's p95 and p50 mirrored below it); agrees: the band overlaps the measured 95% interval"
        )
        print(check_table(rows))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "check.json"), "w") as f:
                json.dump({"run": args.check, "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows}, f, indent=1)
        return
    rows = table(shapes, scales, arms, phases, a, failure_table)
    text = markdown(rows)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:], "assumptions": asdict(a)}
        meta["phases"] = {k: asdict(v) for k, v in phases.items()}
        with open(os.path.join(args.out, "rows.json"), "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(text + "\n")
        plot(rows, os.path.join(args.out, "ettr.png"))
    first, top = shapes[0].name, max(scales)
    print(" ".join(f"ettr_{first}_{top}_{r.arm}={r.ettr:.4f}" for r in rows if r.shape == first and r.gpus == top))


if __name__ == "__main__":
    main()
