"""Goodput under a fault rate: Poisson faults at several rates, three ways to recover, one plot.

    monarch-ft goodput-bench                                   # rates 0,1,2,4 per min, 75 s cells: 14 cells, ~20 min
    monarch-ft goodput-bench goodput.cell_s=45 'goodput.rates=[0,2]' hydra.run.dir=outputs/goodput
    monarch-ft goodput-bench ft.replica_groups=3               # a job override applies to every cell

Each cell is one job (the drill's small job: monarch_ft/configs/drill_common.yaml; 2 groups x 1 rank by default)
that trains ``goodput.cell_s`` seconds from its first commit and is then stopped (``python -m monarch_ft
stop``). Arms (chaos/goodput.py: ARMS): ``live_standby`` (a warm standby takes a failed group's place),
``live`` (no standby: relaunches fork from the warm fork server), ``full_restart`` (every group
resumed from the last disk checkpoint). At each rate every arm gets the same faults: Poisson arrivals
drawn once from ``goodput.seed``, each of a kind drawn from process, node, SIGSTOP hang, GIL hang and an
aborted collective (``goodput.kinds``). A fault-free cell (the ``live`` arm, no faults) runs before each
rate's cells and once after the last; a cell's ratio divides by the mean of the two around it, measured
minutes apart in the same run (chaos/goodput.py: plan_cells); the standby arm's own fault-free cell
shows what the idle standby costs.

Per cell: committed group-steps per second, its ratio to the fault-free rate (goodput) and ETTR,
both monarch_ft.records.goodput's (the drill report's definitions), and the faults injected (a fault
waits for the previous one's recovery, so a slow arm gets fewer at a high rate). A progress line per
cell; ``<run>/goodput.json``, ``goodput.md`` and ``goodput.png`` (goodput against rate, one line per
arm) rewritten after each; the last line reads ``goodput_standby_at_2pm=R goodput_full_restart_at_2pm=R``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import List

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from chaos.config import DrillConfig
from chaos.goodput import ARMS, REFERENCE_ARM, Cell, Planned, cell_figures, closing_line, faults_override, plan_cells, poisson_faults, reference_rate
from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.cli.run import CONFIG_DIR
from monarch_ft.common.process import on_python_path
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.reports import ReportTail

FIRST_COMMIT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 300.0
MIN_CELL_S = 20.0
NEVER_S = 1e9


@dataclass
class GoodputConfig:
    """The goodput bench's cells (``monarch-ft goodput-bench`` only): rates x arms, each cell one job."""

    rates: List[float] = field(default_factory=lambda: [0.0, 1.0, 2.0, 4.0])
    """Faults per minute, one cell per arm at each (0: the fault-free cells)."""

    arms: List[str] = field(default_factory=lambda: list(ARMS))
    """How a failed group comes back: ``live_standby`` (a warm standby), ``live`` (no standby: a warm
    fork), ``full_restart`` (every group from the last disk checkpoint)."""

    kinds: List[str] = field(default_factory=lambda: ["process_kill", "node", "hang", "hang:gil", "collective"])
    """The fault kinds drawn from, uniformly, a mode after a colon: process, node, SIGSTOP hang, a rank
    sleeping with the GIL held, an aborted collective."""

    cell_s: float = 75.0
    """Seconds each cell trains, from its first commit (at least 20: a cell's last 10 s draw no faults)."""

    seed: int = 0
    """Seeds the faults' times and kinds (the same for every arm at a rate)."""

    def check(self) -> None:
        """Refuse cells that cannot run, before any runs (ConfigError, one line naming the fix)."""
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ConfigError(f"goodput.arms={list(self.arms)}: choose among {', '.join(ARMS)}")
        if not self.rates or any(r < 0 for r in self.rates):
            raise ConfigError(f"goodput.rates={list(self.rates)}: give faults per minute, each >= 0, e.g. [0,1,2,4]")
        from chaos.kinds import fault_kinds

        kinds = fault_kinds()
        for text in self.kinds:
            kind, _, mode = text.partition(":")
            if kind not in kinds or (mode and mode not in kinds[kind].modes):
                raise ConfigError(f"goodput.kinds: {text!r}: choose among {', '.join(kinds)} (a mode after a colon, e.g. hang:gil)")
        if self.cell_s < MIN_CELL_S:
            raise ConfigError(f"goodput.cell_s={self.cell_s:g}: must be >= {MIN_CELL_S:g} (a cell's last 10 s draw no faults)")


@dataclass
class GoodputBenchConfig(DrillConfig):
    """The goodput bench: a drill's job (every section of :class:`DrillConfig`) and its cells."""

    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """The cells: rates x arms."""


ConfigStore.instance().store(name="goodput_bench_schema", node=GoodputBenchConfig)

# What each arm or each cell sets itself: given on the command line, it would be overwritten.
SET_BY_CELLS = ("ft.recovery", "ft.standby_groups", "training.steps", "chaos.")


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


def drill_job_overrides() -> list[str]:
    """The drill's small job (monarch_ft/configs/drill_common.yaml) as overrides, for the fault-free cell, which
    runs the pretraining recipe (a drill refuses to run without a fault): one job in every cell."""
    from omegaconf import OmegaConf

    common = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, "drill_common.yaml")))
    out = [f"model={next(d['model'] for d in common['defaults'] if isinstance(d, dict) and 'model' in d)}"]
    for section in ("training", "ft", "checkpoint"):
        for key, value in (common.get(section) or {}).items():
            out.append(f"{section}.{key}={value}")
    return out


def run_cell(run_dir: str, arm: str, faults: list[dict], seconds: float, base: list[str], extra: list[str]) -> tuple[list[dict], float, int]:
    """Run one cell; returns (its step records, its first commit's time, faults injected)."""
    base = [*base, *ARMS[arm]]
    if faults:
        # The drill ends only when stopped: a drill asks to finish chaos.tail_steps after its last
        # fault recovered, so a last fault that never comes due keeps it training until the cell's
        # time is up (the drill then reports that fault not injected, and exits 1).
        never = {"kind": faults[0]["kind"], "at_s": NEVER_S}
        argv = ["-m", "monarch_ft.recipes.drill", *base, "training.steps=1000000", faults_override([*faults, never])]
    else:
        argv = ["-m", "monarch_ft.recipes.pretrain", *drill_job_overrides(), *base, "training.steps=1000000"]
    argv = [sys.executable, *argv, *extra, f"hydra.run.dir={run_dir}"]
    log = open(run_dir + ".console.log", "wb")
    job = subprocess.Popen(argv, env=on_python_path(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tail = ReportTail(os.path.join(run_dir, "metrics.jsonl"))
    records: list[dict] = []
    try:
        deadline = time.time() + FIRST_COMMIT_TIMEOUT_S
        first = None
        while first is None:
            if job.poll() is not None:
                fail(f"the {arm} cell's job exited ({job.returncode}) before its first commit: see {run_dir}.console.log", 1)
            if time.time() > deadline:
                fail(f"the {arm} cell's job did not commit a step within {FIRST_COMMIT_TIMEOUT_S:.0f}s: see {run_dir}.console.log", 1)
            records += tail.read()
            first = min((r["time"] for r in records if r.get("committed")), default=None)
            time.sleep(0.5)
        time.sleep(max(0.0, first + seconds - time.time()))
        stop = subprocess.run(
            [sys.executable, "-m", "monarch_ft", "stop", run_dir], env=on_python_path(os.environ), capture_output=True, text=True, timeout=STOP_TIMEOUT_S
        )
        if stop.returncode != 0:
            print(f"[goodput_bench] stop of {run_dir}: {stop.stdout.strip()} {stop.stderr.strip()}", flush=True)
        job.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if job.poll() is None:
            # Interrupted: the controller stops its job on SIGTERM (its ranks run in sessions of their
            # own, which a SIGKILL of its process group would leave running until their lease).
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        log.close()
    records += tail.read()
    injected = 0
    drill = os.path.join(run_dir, "drill.json")
    if faults and os.path.exists(drill):
        with open(drill) as f:
            injected = sum(1 for x in json.load(f)["faults"] if x.get("injected") and (x.get("at_s") or 0) < NEVER_S)
    return records, first, injected


def write_outputs(out: str, cells: list[Cell], meta: dict) -> None:
    with open(os.path.join(out, "goodput.json"), "w") as f:
        json.dump({**meta, "cells": [asdict(c) for c in cells]}, f, indent=2)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "| arm | faults/min | faults (injected) | group-steps/s | goodput (ratio to fault-free) | ETTR |",
        "|---|---|---|---|---|---|",
    ]
    refs = ", ".join(f"{r:.3f}" for r in meta.get("fault_free_rates", []))
    lines += [f"| fault-free references ({REFERENCE_ARM}, around each rate's cells) | 0 | 0 | {fmt(meta.get('fault_free_rate'))} (mean of {refs}) | 1 | |"]
    lines += [f"| {c.arm} | {c.rate_per_min:g} | {c.faults} ({c.injected}) | {fmt(c.rate)} | {fmt(c.ratio)} | {fmt(c.ettr)} |" for c in cells]
    with open(os.path.join(out, "goodput.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for arm in ARMS:
        pts = {(c.rate_per_min, c.ratio) for c in cells if c.arm == arm and c.ratio is not None}
        if pts and arm in (REFERENCE_ARM, "full_restart"):
            pts.add((0.0, 1.0))  # with no faults both are the reference job itself
        pts = sorted(pts)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm)
    ax.set_xlabel("faults per minute")
    ax.set_ylabel("goodput / fault-free rate")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    ax.set_title(f"goodput, {meta['cell_s']:g} s cells, {meta['groups']} groups")
    fig.savefig(os.path.join(out, "goodput.png"), dpi=110, bbox_inches="tight")


@hydra_main("goodput_bench")
def main(cfg: DictConfig) -> None:
    job: GoodputBenchConfig = OmegaConf.to_object(cfg)
    # A SIGTERM unwinds like Ctrl-C: the cell's job is killed on the way out (run_cell's finally).
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
    plan = plan_cells(g.rates, g.arms)
    meta = {"cell_s": g.cell_s, "seed": g.seed, "groups": groups, "kinds": list(g.kinds), "overrides": extra, "started": time.time()}
    measured: list[tuple[Planned, list[dict], float, int, int]] = []
    references: dict[int, float] = {}
    cells: list[Cell] = []
    started = time.time()
    names = [("reference" if p.reference else f"{p.arm}@{p.rate_per_min:g}/min") for p in plan]
    print(f"[goodput_bench] {len(plan)} cells of {g.cell_s:g} s: {', '.join(names)}; results in {out}", flush=True)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    for n, cell in enumerate(plan, start=1):
        faults = poisson_faults(cell.rate_per_min, g.cell_s, g.seed, g.kinds)
        run_dir = os.path.join(out, f"{n:02d}-{'reference' if cell.reference else cell.arm}-{cell.rate_per_min:g}pm")
        records, first, injected = run_cell(run_dir, cell.arm, faults, g.cell_s, base, extra)
        if cell.reference:
            raw = cell_figures(cell.arm, 0.0, records, groups, first, g.cell_s, 0, 0, None)
            if not raw.rate:
                fail(f"the fault-free cell committed nothing: see {run_dir}.console.log", 1)
            references[n - 1] = raw.rate
            meta["fault_free_rates"] = [references[i] for i in sorted(references)]
        else:
            measured.append((cell, records, first, len(faults), injected))
        # Every ratio again against the references measured so far (a block's closing one settles it).
        cells = [cell_figures(p.arm, p.rate_per_min, rec, groups, t0, g.cell_s, nf, ni, reference_rate(p, references)) for p, rec, t0, nf, ni in measured]
        write_outputs(out, cells, {**meta, "fault_free_rate": sum(references.values()) / len(references)})
        elapsed = time.time() - started
        shown, what = (raw, "fault-free reference") if cell.reference else (cells[-1], cell.arm)
        print(
            f"[goodput_bench {elapsed / 60:4.1f} min] cell {n}/{len(plan)} {what} at {cell.rate_per_min:g}/min: "
            f"faults {injected}/{len(faults)} injected, {fmt(shown.rate)} group-steps/s, goodput {fmt(shown.ratio)}, ETTR {fmt(shown.ettr)} "
            f"(about {elapsed / n * (len(plan) - n) / 60:.1f} min left)",
            flush=True,
        )
    print(f"[goodput_bench] {os.path.join(out, 'goodput.md')}, {os.path.join(out, 'goodput.png')}", flush=True)
    print(closing_line(cells), flush=True)


if __name__ == "__main__":
    main()
