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

``--check RUN`` compares the model with a ``recipes/goodput_bench.py`` run (its ``goodput.json``, and each
cell's ``drill.json`` where the run directory holds them): for each measured cell, the goodput ratio the
model predicts from the recorded drill phases (and from the cell's own measured phases) beside the one
measured, with the same groups, cell length and faults injected.

Ends with one line: ``ettr_<shape>_<gpus>_<arm>=…`` for the largest scale of the first shape.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
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
# long (docs/results/drill-every-fault-kind/drill.json: 0.134 s).
ABORTED_COLLECTIVE_STALL_S = 0.134
BENCH_ARM = {"live_standby": "live_standby", "live": "live_fork", "full_restart": "full_restart"}


def fault_kind(fault: dict) -> str:
    """A drill fault's kind as the sweep summaries name it (``hang:gil``, ``collective:hang``)."""
    return f"{fault['kind']}:{fault['mode']}" if fault.get("mode") else fault["kind"]


def fault_loss(arm: str, groups: int, kind: str, ph: Phases, step_s: float, ckpt_interval_steps: int) -> float:
    """Group-seconds one fault of ``kind`` costs a goodput_bench cell of ``groups`` groups.

    Args:
        arm: the bench's arm (``live_standby``, ``live``, ``full_restart``).
        groups: the job's groups.
        kind: the fault's kind (an aborted ``collective`` recovers in place in every arm).
        ph: the phases that price it.
        step_s: the job's fault-free step time.
        ckpt_interval_steps: ``checkpoint.interval`` (a full restart redoes half of it on average).
    """
    if kind == "collective":
        return groups * ph.stall_s
    if arm == "full_restart":
        return groups * (ph.mttr_s + ckpt_interval_steps * step_s / 2.0)
    return (groups - 1) * ph.stall_s + ph.mttr_s + step_s


def kind_phases(path: str, arm: str, kind: str) -> Optional[Phases]:
    """``arm``'s phases for one fault kind from an mttr_bench summary (None: not in it)."""
    with open(path) as f:
        stats = json.load(f).get("stats") or {}
    name = SUMMARY_ARM.get(arm, arm)
    entry = (stats.get(kind) or {}).get(name)
    if not entry or entry["phases"]["replacement_up"]["p50"] is None:
        return None
    p = entry["phases"]
    return Phases(
        p["detected"]["p50"],
        p["replacement_up"]["p50"] - p["detected"]["p50"],
        0.0,
        0.0,
        p["back_in_quorum"]["p50"] - p["weights_recovered"]["p50"],
        entry["survivor_max_stall_s"]["mean"],
        entry["mttr"]["p50"],
        path,
    )


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


def check(run: str, phases: dict[str, Phases], ckpt_interval_steps: int, summary: Optional[str] = None) -> list[dict[str, Any]]:
    """Each measured cell of a goodput_bench run beside the model's prediction: the cell's fault-free
    rate less the group-seconds its injected faults cost, priced (a) by the recorded phases (per
    fault kind where ``summary`` has the kind, else the arm's), (b) by the cell's own measured
    phases, each fault by its own (where the run directory holds the cell's drill.json).

    Args:
        run: the run directory (or its ``goodput.json``).
        phases: the recorded phases per arm.
        ckpt_interval_steps: the cells' ``checkpoint.interval``.
        summary: an mttr_bench summary.json with phases per kind (default: the recorded sweep).
    """
    summary = summary or os.path.join(REPO, RECORDED["live_fork"])
    path = run if run.endswith(".json") else os.path.join(run, "goodput.json")
    with open(path) as f:
        bench = json.load(f)
    folder = os.path.dirname(path)
    groups, seconds = bench["groups"], bench["cell_s"]
    fault_free = bench.get("fault_free_rate") or 0.0
    # The reference's committed group-steps per second over all groups: its step time.
    step_s = groups / fault_free if fault_free else 0.0
    out = []
    for cell in bench["cells"]:
        if not cell.get("injected") or cell.get("ratio") is None:
            continue
        arm = BENCH_ARM[cell["arm"]]
        own = _cell_drill(folder, cell)
        faults = []
        if own is not None:
            with open(own) as f:
                faults = [x for x in json.load(f)["faults"] if x.get("injected")]
        kinds = [fault_kind(x) for x in faults] or [None] * cell["injected"]
        recorded = 0.0
        for kind in kinds:
            if kind == "collective":
                ph = Phases(0.0, 0.0, 0.0, 0.0, 0.0, ABORTED_COLLECTIVE_STALL_S, ABORTED_COLLECTIVE_STALL_S, "drill-every-fault-kind")
            else:
                ph = (kind_phases(summary, arm, kind) if kind else None) or phases[arm]
            recorded += fault_loss(cell["arm"], groups, kind or "", ph, step_s, ckpt_interval_steps)
        row = {
            "arm": cell["arm"],
            "rate_per_min": cell["rate_per_min"],
            "groups": groups,
            "faults": cell["injected"],
            "kinds": [k for k in kinds if k],
            "measured": cell["ratio"],
            "predicted": max(0.0, 1.0 - recorded / (groups * seconds)),
        }
        if faults:
            measured_loss = sum(fault_loss(cell["arm"], groups, fault_kind(x), own_phases(x), step_s, ckpt_interval_steps) for x in faults)
            row["predicted_own_phases"] = max(0.0, 1.0 - measured_loss / (groups * seconds))
        out.append(row)
    return out


def _cell_drill(folder: str, cell: dict) -> Optional[str]:
    """The cell's own drill.json (goodput_bench names a cell's run directory NN-ARM-RATEpm)."""
    import glob

    found = sorted(glob.glob(os.path.join(folder, f"[0-9][0-9]-{cell['arm']}-{cell['rate_per_min']:g}pm", "drill.json")))
    return found[0] if found else None


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
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


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
        except (OSError, ValueError, KeyError) as e:
            fail(f"--check {args.check}: {e}")
        print("| arm | faults/min | groups | faults (kinds) | measured goodput ratio | predicted (recorded phases) | predicted (the cell's phases) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            own = r.get("predicted_own_phases")
            kinds = f" ({', '.join(r['kinds'])})" if r["kinds"] else ""
            print(
                f"| {r['arm']} | {r['rate_per_min']:g} | {r['groups']} | {r['faults']}{kinds} | {r['measured']:.3f} | {r['predicted']:.3f} "
                f"| {'' if own is None else f'{own:.3f}'} |"
            )
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
