"""Goodput under a fault rate: arms interleaved over repetitions, each with its own fault-free cells,
against plain no-FT training, with 95% intervals and the realised fault rate.

    monarch-ft goodput-bench                                   # the defaults: 21 cells, about 35 min on a quiet 2-core machine
    monarch-ft goodput-bench goodput.cell_s=40 goodput.repetitions=1 'goodput.arms=[live_standby,full_restart]'   # a smoke
    monarch-ft goodput-bench 'goodput.rates=[0,1,2,4]' goodput.repetitions=5                                     # a longer study

Each cell is one job (the drill's small job: monarch_ft/configs/drill_common.yaml; 2 groups x 1 rank) that runs
``goodput.cell_s`` seconds from its launch and is then stopped (``python -m monarch_ft stop``). Arms
(chaos/goodput.py: ARMS): ``live_standby`` (hsdp; a warm standby takes a failed group's place, the
next standby forked from the host's fork server), ``full_restart`` (every group resumed from the last
disk checkpoint), ``diloco_standby`` (``ft.mode=diloco`` with a standby), ``live`` (hsdp, no standby:
relaunches fork from the warm fork server). A repetition runs plain no-FT training once
(monarch_ft/recipes/noft_train.py) and every arm at every rate, the fault-free rate 0 included, arms
interleaved (odd repetitions in reverse order); each repetition draws its own faults, the same for
every arm at a rate (Poisson arrivals over the whole cell, kinds from ``goodput.kinds``), and fires
them on schedule whatever is still recovering (``chaos.overlap=true``, the last healthy group too).

Figures (monarch_ft.records.goodput, chaos/goodput.py): goodput is useful group-steps (those on the
final lineage: re-done steps once, rolled-back ones zero) per second from launch to the last useful
commit, warm-up charged; per arm and rate its ratio to the same arm's fault-free cells and to no-FT,
per provisioned replica (standbys counted) against no-FT's, and ETTR at the arm's fault-free median
step time, each with a 95% bootstrap interval over the repetitions, and the realised fault rate with
every fault not recovered or never fired counted. A progress line as each cell starts, every 30 s
and as it ends; ``<run>/goodput.json``, ``goodput.md`` and ``goodput.png`` rewritten after each cell;
the last line reads ``goodput_standby_at_2pm=R goodput_standby_at_2pm_lo=L goodput_standby_at_2pm_hi=H
goodput_full_restart_at_2pm=... goodput_diloco_standby_at_2pm=... goodput_standby_per_provisioned_at_2pm=...
realised_rate_2pm=F``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from chaos.config import DrillConfig
from chaos.goodput import (
    ARMS,
    DEFAULT_ARMS,
    NOFT,
    NOFT_LABEL,
    CellFigures,
    Summary,
    arm_pace,
    cell_figures,
    closing_line,
    fault_outcomes,
    faults_override,
    plan_cells,
    poisson_faults,
    realised_rate,
    summarize,
)
from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.common.process import on_python_path
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.layout import RunLayout, read_json, read_jsonl
from monarch_ft.records.reports import ReportTail
from monarch_ft.records.stats import spread

FIRST_COMMIT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 300.0
MIN_CELL_S = 20.0
# The placeholder fault that keeps a cell's drill open until the bench stops it (a drill asks to
# finish chaos.tail_steps after its last fault recovered); never due, left out of every figure.
NEVER_S = 1e9
PROGRESS_EVERY_S = 30.0


@dataclass
class GoodputConfig:
    """The goodput bench's cells (``monarch-ft goodput-bench`` only): repetitions x rates x arms, each cell one job."""

    rates: List[float] = field(default_factory=lambda: [0.0, 2.0])
    """Faults per minute, one cell per arm at each in every repetition (0, each arm's fault-free cells, always runs)."""

    arms: List[str] = field(default_factory=lambda: list(DEFAULT_ARMS))
    """How a job runs and comes back: ``live_standby`` (a warm standby), ``full_restart`` (every group from
    the last disk checkpoint), ``diloco_standby`` (``ft.mode=diloco`` with a standby), ``live`` (no standby:
    a warm fork). Plain no-FT training runs once per repetition whatever is chosen."""

    repetitions: int = 3
    """Times the whole block of cells runs, each with its own seed (its own faults): the intervals' units."""

    kinds: List[str] = field(default_factory=lambda: ["process_kill", "node", "hang", "hang:gil", "collective"])
    """The fault kinds drawn from, uniformly, a mode after a colon: process, node, SIGSTOP hang, a rank
    sleeping with the GIL held, an aborted collective."""

    cell_s: float = 90.0
    """Seconds each cell runs, from its job's launch to the stop (at least 20)."""

    seed: int = 0
    """The first repetition's seed (the next count up): the faults' times and kinds."""

    def check(self) -> None:
        """Refuse cells that cannot run, before any runs (ConfigError, one line naming the fix)."""
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ConfigError(f"goodput.arms={list(self.arms)}: choose among {', '.join(ARMS)}")
        if not self.rates or any(r < 0 for r in self.rates):
            raise ConfigError(f"goodput.rates={list(self.rates)}: give faults per minute, each >= 0, e.g. [0,2]")
        if self.repetitions < 1:
            raise ConfigError(f"goodput.repetitions={self.repetitions}: must be >= 1 (3 or more for an interval)")
        from chaos.kinds import fault_kinds

        kinds = fault_kinds()
        for text in self.kinds:
            kind, _, mode = text.partition(":")
            if kind not in kinds or (mode and mode not in kinds[kind].modes):
                raise ConfigError(f"goodput.kinds: {text!r}: choose among {', '.join(kinds)} (a mode after a colon, e.g. hang:gil)")
        if self.cell_s < MIN_CELL_S:
            raise ConfigError(f"goodput.cell_s={self.cell_s:g}: must be >= {MIN_CELL_S:g} (a job takes seconds to start)")


@dataclass
class GoodputBenchConfig(DrillConfig):
    """The goodput bench: a drill's job (every section of :class:`DrillConfig`) and its cells."""

    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """The cells: repetitions x rates x arms."""


ConfigStore.instance().store(name="goodput_bench_schema", node=GoodputBenchConfig)

# What each arm or each cell sets itself: given on the command line, it would be overwritten.
SET_BY_CELLS = ("ft.recovery", "ft.standby_groups", "ft.mode", "training.steps", "chaos.")


def job_overrides(task: list[str]) -> list[str]:
    """The command line's job overrides, passed to every cell's job (ConfigError for a key a cell sets)."""
    out = []
    for o in task:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith("goodput.") or key.startswith("hydra."):
            continue
        if any(key == k or (k.endswith(".") and key.startswith(k)) for k in SET_BY_CELLS):
            raise ConfigError(f"{key} has no effect in the goodput bench (each arm and cell sets it: goodput.arms, goodput.rates): drop it")
        out.append(o)
    return out


def fail(message: str, code: int = 2) -> None:
    print(f"monarch_ft: error: {message}", file=sys.stderr)
    sys.exit(code)


@dataclass
class CellRun:
    """What running one cell left: its records and times (the figures are computed from it)."""

    metrics: list[dict]
    events: list[dict]
    launched_at: float
    stopped_at: float
    exit_code: Optional[int]
    ended_early: bool
    provisioned: int
    drill: dict = field(default_factory=dict)


def _stop(job: subprocess.Popen) -> None:
    """Interrupted: the controller (or torchrun) stops its job on SIGTERM; a SIGKILL of the group if it does not."""
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def _wait_cell(job: subprocess.Popen, name: str, launched: float, seconds: float, log: str, commits, injected) -> bool:
    """Wait out the cell's time, printing progress; False if the job ended before it."""
    deadline = launched + seconds
    first_deadline = launched + FIRST_COMMIT_TIMEOUT_S
    last_print = time.time()
    while time.time() < deadline:
        if job.poll() is not None:
            return False
        if commits() == 0 and time.time() > first_deadline:
            _stop(job)
            fail(f"the {name} cell's job did not commit a step within {FIRST_COMMIT_TIMEOUT_S:.0f}s: see {log}", 1)
        if time.time() - last_print >= PROGRESS_EVERY_S:
            last_print = time.time()
            print(f"[goodput_bench]   {name}: {time.time() - launched:4.0f}/{seconds:g} s, {commits()} commits, {injected()} faults injected", flush=True)
        time.sleep(0.5)
    return True


def run_ft_cell(run_dir: str, arm: str, faults: list[dict], seconds: float, base: list[str], extra: list[str]) -> CellRun:
    """One cell of a fault-tolerant arm: the drill recipe with the cell's faults (none for a fault-free
    cell: only the placeholder that keeps the drill open), stopped ``seconds`` after its launch."""
    never = {"kind": "process_kill", "at_s": NEVER_S}
    argv = [
        sys.executable,
        "-m",
        "monarch_ft.recipes.drill",
        *base,
        *ARMS[arm].overrides,
        "training.steps=1000000",
        "chaos.overlap=true",
        "chaos.allow_last_healthy=true",
        faults_override([*faults, never]),
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    layout = RunLayout(run_dir)
    with open(run_dir + ".console.log", "wb") as log:
        launched = time.time()
        job = subprocess.Popen(argv, env=on_python_path(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        metrics, events = ReportTail(layout.metrics), ReportTail(layout.events)
        seen = {"commits": 0, "injected": 0}

        def commits() -> int:
            seen["commits"] += sum(1 for m in metrics.read() if m.get("committed"))
            return seen["commits"]

        def injected() -> int:
            seen["injected"] += sum(1 for e in events.read() if e.get("event") == "fault_injected")
            return seen["injected"]

        try:
            full = _wait_cell(job, f"{arm} cell", launched, seconds, run_dir + ".console.log", commits, injected)
            stopped = time.time()
            if full:
                stop = subprocess.run(
                    [sys.executable, "-m", "monarch_ft", "stop", run_dir],
                    env=on_python_path(os.environ),
                    capture_output=True,
                    text=True,
                    timeout=STOP_TIMEOUT_S,
                )
                if stop.returncode != 0:
                    print(f"[goodput_bench]   stop of {run_dir}: {stop.stdout.strip()} {stop.stderr.strip()}", flush=True)
                job.wait(timeout=STOP_TIMEOUT_S)
        finally:
            _stop(job)
    summary = read_json(layout.summary) or {}
    provisioned = int(summary.get("replica_groups") or 0) or len({m["group"] for m in read_jsonl(layout.metrics)})
    standbys = int((summary.get("standby") or {}).get("standby_groups") or 0)
    return CellRun(
        metrics=read_jsonl(layout.metrics),
        events=read_jsonl(layout.events),
        launched_at=launched,
        stopped_at=stopped,
        exit_code=job.returncode,
        ended_early=not full,
        provisioned=provisioned + standbys,
        drill=read_json(os.path.join(run_dir, "drill.json")) or {},
    )


def noft_spec(job: DrillConfig, out: str, deadline: float) -> dict:
    """monarch_ft.recipes.noft_train's spec for the bench's job: the same model, batch, data and optimizer."""
    from monarch_ft.common.data import prepare_data

    tr = job.training
    data = prepare_data(job.data, job.model.vocab_size, tr.seq_len)
    return {
        "model": {k: v for k, v in asdict(job.model).items() if v is not None},
        "seq_len": tr.seq_len,
        "batch_size": tr.batch_size,
        "lr": tr.lr,
        "weight_decay": tr.weight_decay,
        "warmup_steps": tr.warmup_steps,
        "seed": tr.seed,
        "groups": job.ft.replica_groups,
        "ranks": job.ft.ranks_per_group,
        "threads": tr.threads_per_rank,
        "tokens_path": data.tokens_path,
        "steps": 1000000,
        "out": out,
        "deadline": deadline,
    }


def run_noft_cell(run_dir: str, job: DrillConfig, seconds: float) -> CellRun:
    """One cell of plain no-FT training: torchrun, every rank stopping at the first step after the cell's end."""
    from monarch_ft.recipes.noft_train import command

    os.makedirs(run_dir, exist_ok=True)
    with open(run_dir + ".console.log", "wb") as log:
        launched = time.time()
        spec = noft_spec(job, run_dir, launched + seconds)
        proc = subprocess.Popen(command(spec), env=on_python_path(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=seconds + FIRST_COMMIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"[goodput_bench]   the no-FT cell ran past its end by {FIRST_COMMIT_TIMEOUT_S:.0f} s: stopped", flush=True)
        finally:
            _stop(proc)
    metrics = [m for g in range(job.ft.replica_groups) for m in read_jsonl(os.path.join(run_dir, f"metrics.g{g}.jsonl"))]
    if proc.returncode != 0 and not metrics:
        fail(f"the no-FT cell failed (exit {proc.returncode}): see {run_dir}.console.log", 1)
    return CellRun(metrics, [], launched, launched + seconds, proc.returncode, proc.returncode != 0, job.ft.replica_groups)


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def write_outputs(out: str, cells: list[CellFigures], summaries: list[Summary], meta: dict) -> None:
    """goodput.json (every cell and the summary), goodput.md (the tables) and goodput.png."""
    with open(os.path.join(out, "goodput.json"), "w") as f:
        json.dump({**meta, "summary": [s.as_dict() for s in summaries], "cells": [c.as_dict() for c in cells]}, f, indent=2)
    lines = [
        "Goodput: useful group-steps per second from launch to the last useful commit (monarch_ft/records/goodput.py). "
        "Each ratio is the mean over the repetitions' cells over the mean of their references, with a 95% bootstrap interval "
        "over repetitions (n: repetitions; no interval below 3). Kept at own pace: what each cell kept against its own pace in the "
        "seconds between its faults (each fault's span: injection to return + 3 s), the faults' direct cost without the machine's "
        "drift between cells; a fault-free cell's reads about 1 (the figure's own error).",
        "",
        "| arm | faults/min | cells | goodput / own fault-free [95% CI] | / no-FT [95% CI] | per provisioned replica / no-FT [95% CI] "
        "| ETTR [95% CI] | realised faults/min | faults due: injected, recovered, not recovered, never fired "
        "| MTTR p50, p95 [95% CI], max, n | cells ended early | kept at own pace [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        label = NOFT_LABEL if s.arm == NOFT else s.arm
        own = "1 (the reference)" if s.rate_per_min == 0 else s.goodput.text()
        faults = f"{s.scheduled}: {s.injected}, {s.recovered}, **{s.not_recovered}**, {s.not_injected}" if s.rate_per_min > 0 else "-"
        lines.append(
            f"| {label} | {s.rate_per_min:g} | {s.cells} | {own} | {s.vs_noft.text()} | {s.per_provisioned.text()} | {s.ettr.text()} "
            f"| {_fmt(s.realised_rate, 2)} | {faults} | {spread(s.mttr_s).text(2, ' s') if s.rate_per_min > 0 else '-'} | {s.failed_cells} "
            f"| {s.own_pace.text()} |"
        )
    lines += [
        "",
        "Cells (in running order):",
        "",
        "| # | cell | seed | useful group-steps/s | per provisioned replica | useful / trained (rolled back) | window (s) | median step (s) "
        "| faults (injected/due) | not recovered or never fired: why | kept at own pace |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, c in enumerate(cells, start=1):
        why = "; ".join(f"{f.kind} at {f.at_s:.1f} s: {f.why or 'not back'}" for f in c.faults if not (f.injected and f.recovered)) or ""
        lines.append(
            f"| {i} | {c.arm}@{c.rate_per_min:g}/min{' (ended early, exit ' + str(c.exit_code) + ')' if c.ended_early else ''} | {c.seed} | {_fmt(c.rate)} "
            f"| {_fmt(c.per_provisioned)} | {c.useful} / {c.trained} ({c.rolled_back}) | {_fmt(c.seconds, 1)} | {_fmt(c.median_step_s, 4)} "
            f"| {c.injected}/{len(c.faults)} | {why} | {_fmt(c.own_pace)} |"
        )
    lines += ["", f"realised faults/min at 2/min over every arm: {_fmt(realised_rate(cells, 2.0), 2)}"]
    with open(os.path.join(out, "goodput.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plot(os.path.join(out, "goodput.png"), cells, summaries, meta)


def _plot(path: str, cells: list[CellFigures], summaries: list[Summary], meta: dict) -> None:
    """Left: goodput over the arm's own fault-free cells against the rate, the mean with its interval
    and each repetition's cell as a dot. Right: useful group-steps/s of every cell in running order."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    arms = [a for a in dict.fromkeys(c.arm for c in cells) if a != NOFT]
    colors = {a: f"C{i}" for i, a in enumerate(arms)}
    by = {(c.arm, c.rate_per_min, c.repetition): c for c in cells}
    for i, arm in enumerate(arms):
        rows = sorted((s for s in summaries if s.arm == arm and s.goodput.value is not None), key=lambda s: s.rate_per_min)
        xs = [s.rate_per_min + (i - len(arms) / 2) * 0.06 for s in rows]
        ys = [s.goodput.value for s in rows]
        lo = [y - (s.goodput.lo if s.goodput.lo is not None else y) for s, y in zip(rows, ys)]
        hi = [(s.goodput.hi if s.goodput.hi is not None else y) - y for s, y in zip(rows, ys)]
        err = [lo, hi]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colors[arm], label=arm)
        for c in cells:
            ff = by.get((arm, 0.0, c.repetition))
            if c.arm == arm and c.rate_per_min > 0 and ff is not None and ff.rate:
                ax.scatter([c.rate_per_min + (i - len(arms) / 2) * 0.06], [(c.rate or 0) / ff.rate], s=10, color=colors[arm], alpha=0.4)
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_xlabel("faults per minute (scheduled)")
    ax.set_ylabel("goodput / same arm's fault-free (95% CI)")
    ax.grid(alpha=0.3)
    if ax.containers:
        ax.legend(fontsize=8)
    for i, c in enumerate(cells):
        color = "0.3" if c.arm == NOFT else colors[c.arm]
        bx.bar(i, c.rate or 0.0, color=color, alpha=0.5 if c.rate_per_min == 0 else 1.0, edgecolor="red" if c.not_recovered or c.ended_early else color)
    bx.set_xlabel("cell, in running order (pale: fault-free; dark grey: no-FT; red edge: a fault not recovered)")
    bx.set_ylabel("useful group-steps/s")
    bx.grid(alpha=0.3, axis="y")
    fig.suptitle(f"goodput bench: {meta['cell_s']:g} s cells from launch, {meta['repetitions']} repetitions, {meta['groups']} groups")
    fig.savefig(path, dpi=110, bbox_inches="tight")


@hydra_main("goodput_bench")
def main(cfg: DictConfig) -> None:
    job: GoodputBenchConfig = OmegaConf.to_object(cfg)
    # A SIGTERM unwinds like Ctrl-C: the cell's job is stopped on the way out (the runners' finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    g = job.goodput
    try:
        g.check()
        extra = job_overrides(list(HydraConfig.get().overrides.task))
    except ConfigError as e:
        fail(str(e))
    out = os.path.abspath(HydraConfig.get().runtime.output_dir)
    os.makedirs(out, exist_ok=True)
    groups = job.ft.replica_groups
    base = [f"ft.replica_groups={groups}", f"ft.ranks_per_group={job.ft.ranks_per_group}"]
    tokens = job.training.batch_size * job.training.seq_len * job.ft.ranks_per_group
    plan = plan_cells(g.rates, list(g.arms), g.repetitions, g.seed)
    meta = {
        "cell_s": g.cell_s,
        "repetitions": g.repetitions,
        "seed": g.seed,
        "rates": sorted(set(g.rates) | {0.0}),
        "arms": list(g.arms),
        "groups": groups,
        "ranks_per_group": job.ft.ranks_per_group,
        "tokens_per_group_step": tokens,
        "kinds": list(g.kinds),
        "overrides": extra,
        "started": time.time(),
    }
    cells: list[CellFigures] = []
    started = time.time()
    print(f"[goodput_bench] {len(plan)} cells of {g.cell_s:g} s ({g.repetitions} repetitions): {', '.join(p.name for p in plan)}; results in {out}", flush=True)
    for n, cell in enumerate(plan, start=1):
        faults = poisson_faults(cell.rate_per_min, g.cell_s, cell.seed, g.kinds)
        run_dir = os.path.join(out, f"{n:02d}-{cell.arm}-{cell.rate_per_min:g}pm-r{cell.repetition}")
        times = ", ".join(f"{f['kind']}{':' + f['mode'] if 'mode' in f else ''}@{f['at_s']:.0f}s" for f in faults) or "none"
        print(f"[goodput_bench {(time.time() - started) / 60:4.1f} min] cell {n}/{len(plan)} {cell.name} (seed {cell.seed}) starts; faults {times}", flush=True)
        if cell.arm == NOFT:
            run = run_noft_cell(run_dir, job, g.cell_s)
        else:
            run = run_ft_cell(run_dir, cell.arm, faults, g.cell_s, base, extra)
        figures = cell_figures(
            cell,
            run.metrics,
            run.events,
            run.launched_at,
            run.launched_at + g.cell_s,
            run.stopped_at,
            groups,
            run.provisioned,
            tokens,
            fault_outcomes(run.drill, NEVER_S),
            run.exit_code,
            run.ended_early,
        )
        cells.append(figures)
        summaries = summarize(cells, groups)
        write_outputs(out, cells, summaries, meta)
        elapsed = time.time() - started
        ff = next((c for c in cells if c.arm == cell.arm and c.rate_per_min == 0 and c.repetition == cell.repetition), None)
        own = (figures.rate or 0) / ff.rate if ff is not None and ff.rate and cell.rate_per_min > 0 else None
        pace = arm_pace(cells, cell.arm)
        ettr = figures.useful * pace / (groups * figures.seconds) if pace and figures.seconds else None
        print(
            f"[goodput_bench {elapsed / 60:4.1f} min] cell {n}/{len(plan)} {cell.name}: {_fmt(figures.rate)} useful group-steps/s "
            f"({figures.useful} useful of {figures.trained} trained, {figures.rolled_back} rolled back; window {_fmt(figures.seconds, 1)} s from launch), "
            f"goodput/own fault-free {_fmt(own)}, kept at own pace {_fmt(figures.own_pace)}, ETTR {_fmt(ettr)}, "
            f"faults {figures.injected}/{len(figures.faults)} injected, "
            f"{figures.not_recovered} not recovered{', ENDED EARLY exit ' + str(figures.exit_code) if figures.ended_early else ''} "
            f"(about {elapsed / n * (len(plan) - n) / 60:.1f} min left)",
            flush=True,
        )
    print(f"[goodput_bench] {os.path.join(out, 'goodput.md')}, {os.path.join(out, 'goodput.png')}", flush=True)
    print(closing_line(summarize(cells, groups), cells), flush=True)


if __name__ == "__main__":
    main()
