"""How recovery and the controller's own cost grow with the number of replica groups.

    python benchmarks/scale_bench.py                          # 2, 4, 8, 16 groups, 3 faults each
    python benchmarks/scale_bench.py --groups 2,4 --out outputs/scale
    python benchmarks/scale_bench.py --summarize outputs/scale  # the table and plot again from recorded cells
    python benchmarks/scale_bench.py --controller-only 2,4,8,16,32,64   # the controller alone, no process

One cell per group count: the same drill (``recipes/drill.py``) of ``--groups`` groups x 1 rank, the
tiny model, ``launcher=local_hosts`` (each group on its own simulated host), the drill's defaults
otherwise (a warm standby) except the warm fork servers (``ft.warm_fork=false``; ``--warm-fork`` keeps
them): with one group per simulated host the controller keeps a fork server per host, as many
torch processes again as groups, and at 16 groups on 2 cores their start pushed the ranks' start-up
past its 120 s budget (every group was failed as hung before a step). ``--faults`` faults alternate
process kill and node fault, ``--every`` steps apart (each recovers before the next), on groups 1, 0, 1.

Per cell, from its run directory and a sampler of its processes:

- MTTR p50 and the survivors' longest stall p50 (``drill.json``: ``mttr_s``, ``survivor_max_stall_s``);
- the controller's CPU seconds per watch tick (``summary.json``'s ``controller.watch_loop``), and per
  tick per group;
- the quorum latency: p50 of the ranks' ``quorum_s`` per committed step (``metrics.jsonl``: the
  rank's seconds in TorchFT's quorum and commit vote, which wait on the Lighthouse);
- memory: the peak of the summed RSS of the controller and every process under it (ranks, standby,
  fork servers, the Lighthouse), sampled every ``--sample-s``; and the peaks of each role.

The machine's load average is recorded at each cell's start and end. ``<out>/scale.json``,
``scale.md`` and ``scale.png`` (each figure against group count) are written after every cell; a
progress line per cell; the closing line gives the largest cell over the smallest
(``mttr_p50_16_over_2=R controller_cpu_per_tick_per_group_16_over_2=R``). Printed, never asserted.

``--controller-only`` measures the controller's cost apart from the machine's load: the real watch
loop on the fake launcher of the fast tests (``monarch_ft.testing.fakes``: every group of one rank
steps each 0.1 s of fake time and writes real report records, no process started) for ``--steps``
steps per group count. The fake world acts between two ticks and fake time also moves by each tick's
own CPU time (a slow tick delays the next, as on a core of its own; see ``BenchClock``), so the
figures are the controller's whatever else the machine runs: its CPU per tick (p50, p99, max: every tick, the first launch's included), the time
from group 0's rank exiting at the middle step to the decision pass that failed its group (fake time:
the wait for the next tick and the processing before the action; the world's steps fall half a
tick period after a tick starts, the mean wait of an exit at a random time), the bytes of its takeover
state at the end, and how busy it kept its core (its ticks' CPU over the job's fake time). The closing line is the largest count's
(``tick_cpu_p50_ms_N=… tick_cpu_p99_ms_N=… act_latency_ms_N=… state_bytes_N=…``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.provenance import git_commit  # noqa: E402
from monarch_ft.records.stats import percentile  # noqa: E402

KINDS = ("process_kill", "node")
FIGURES = (
    ("mttr_p50_s", "MTTR p50 (s)"),
    ("mttr_p50_steps", "MTTR p50 (in step times p50)"),
    ("stall_p50_s", "survivors' stall p50 (s)"),
    ("controller_cpu_per_tick_ms", "controller CPU per tick (ms)"),
    ("quorum_p50_ms", "quorum p50 (ms)"),
    ("rss_peak_mb", "peak RSS, all processes (MB)"),
    ("controller_cpu_per_tick_per_group_ms", "controller CPU per tick per group (ms)"),
    ("step_p50_s", "step time p50 (s)"),
    ("detected_p50_s", "fault told p50 (s)"),
    ("controller_tick_ms", "controller wall time per tick (ms)"),
)


def faults_override(n: int, groups: int, first_step: int, every: int) -> str:
    """``chaos.faults=[...]``: process kill and node fault alternating, on groups 1, 0, 1, ... (the
    target cycles over the first two groups so every cell hits the same positions)."""
    entries = [f"{{kind: {KINDS[i % len(KINDS)]}, at_step: {first_step + i * every}, target: {(i + 1) % min(groups, 2)}}}" for i in range(n)]
    return "chaos.faults=[" + ", ".join(entries) + "]"


def cell_figures(groups: int, drill: dict, summary: dict, metrics: list[dict], rss: dict) -> dict[str, Any]:
    """The figures of one recorded cell (pure arithmetic; tests/unit/test_scale_bench.py).

    Args:
        groups: the cell's replica groups.
        drill: its ``drill.json``.
        summary: its ``summary.json``.
        metrics: its ``metrics.jsonl`` records (the ranks' step records).
        rss: the sampler's peaks in MB: ``total`` and per role.
    """
    faults = [f for f in drill.get("faults", []) if f.get("injected") and f.get("recovered")]
    mttrs = [f["mttr_s"] for f in faults if f.get("mttr_s") is not None]
    stalls = [f["survivor_max_stall_s"] for f in faults if f.get("survivor_max_stall_s") is not None]
    loop = (summary.get("controller") or {}).get("watch_loop") or {}
    per_tick = loop.get("cpu_s_per_tick")
    committed = [r for r in metrics if r.get("type", "step") == "step" and r.get("committed")]
    quorum = [r["quorum_s"] for r in committed if r.get("quorum_s") is not None]
    step_p50 = percentile([r["step_time_s"] for r in committed if r.get("step_time_s") is not None], 50)
    mttr_p50 = percentile(mttrs, 50)
    phase = lambda name: percentile([f["phases"][name] for f in faults if (f.get("phases") or {}).get(name) is not None], 50)  # noqa: E731
    ms = lambda s: None if s is None else round(s * 1000.0, 3)  # noqa: E731
    return {
        "groups": groups,
        "faults": len(drill.get("faults", [])),
        "recovered": len(faults),
        "mttr_s": mttrs,
        "mttr_p50_s": mttr_p50,
        # The controller's own part of a recovery: the fault told, the replacement up (p50 of each phase's end).
        "detected_p50_s": phase("detected"),
        "replacement_up_p50_s": phase("replacement_up"),
        # A committed step's wall time (p50): on a small machine the ranks share its cores, so
        # a step, and every quorum round of a recovery with it, grows with the groups.
        "step_p50_s": step_p50,
        "mttr_p50_steps": round(mttr_p50 / step_p50, 2) if mttr_p50 is not None and step_p50 else None,
        "stall_p50_s": percentile(stalls, 50),
        "stall_p95_s": percentile(stalls, 95),
        "controller_ticks": loop.get("ticks"),
        "controller_cpu_s": loop.get("cpu_s"),
        "controller_wall_s": loop.get("wall_s"),
        "controller_cpu_per_tick_ms": ms(per_tick),
        "controller_cpu_per_tick_per_group_ms": ms(per_tick / groups) if per_tick is not None else None,
        # Wall time per tick: the loop sleeps 50 ms between ticks; above that, its own work and waiting for a core.
        "controller_tick_ms": round(loop["wall_s"] / loop["ticks"] * 1000.0, 1) if loop.get("ticks") and loop.get("wall_s") is not None else None,
        "controller_cpu_share": round(loop["cpu_s"] / loop["wall_s"], 3) if loop.get("wall_s") else None,
        "quorum_steps": len(quorum),
        "quorum_p50_ms": ms(percentile(quorum, 50)),
        "quorum_p95_ms": ms(percentile(quorum, 95)),
        "rss_peak_mb": rss.get("total"),
        "rss_peak_by_role_mb": {k: v for k, v in rss.items() if k != "total"},
        "job_steps": summary.get("job_step"),
        "status": summary.get("status"),
    }


def ratio(cells: list[dict], key: str) -> Optional[float]:
    """The largest cell's figure over the smallest's (None when either is missing)."""
    if len(cells) < 2:
        return None
    small, large = min(cells, key=lambda c: c["groups"]), max(cells, key=lambda c: c["groups"])
    a, b = small.get(key), large.get(key)
    return round(b / a, 3) if a and b is not None else None


def closing_line(cells: list[dict]) -> str:
    """``mttr_p50_16_over_2=R controller_cpu_per_tick_per_group_16_over_2=R ...`` (largest over smallest cell)."""
    if not cells:
        return "scale_bench: no cell finished"
    lo, hi = min(c["groups"] for c in cells), max(c["groups"] for c in cells)
    parts = [
        f"{name}_{hi}_over_{lo}={ratio(cells, key)}"
        for name, key in (
            ("mttr_p50", "mttr_p50_s"),
            ("mttr_p50_steps", "mttr_p50_steps"),
            ("step_p50", "step_p50_s"),
            ("stall_p50", "stall_p50_s"),
            ("controller_cpu_per_tick_per_group", "controller_cpu_per_tick_per_group_ms"),
            ("quorum_p50", "quorum_p50_ms"),
            ("rss_peak_per_group", "rss_per_group_mb"),
        )
    ]
    return " ".join(parts)


def role_of(cmdline: list[str], controller_pid: int, pid: int) -> str:
    """Which part of the job a process is, by its title (monarch_ft.common.proctitle) or command line."""
    if pid == controller_pid:
        return "controller"
    text = " ".join(cmdline)
    if "lighthouse" in text:
        return "lighthouse"
    if "forkserver" in text or "zygote" in text:
        return "fork_servers"
    if "standby" in text:
        return "standby"
    return "ranks"


class RssSampler:
    """Samples the summed RSS of a process and all its descendants, keeping the peaks (MB)."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.pid, self.every_s = pid, every_s
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.wait(self.every_s):
            by_role: dict[str, float] = {}
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    role = role_of(p.cmdline(), self.pid, p.pid)
                    by_role[role] = by_role.get(role, 0.0) + p.memory_info().rss / 2**20
                except psutil.Error:
                    continue
            by_role["total"] = sum(by_role.values())
            for k, v in by_role.items():
                self.peaks[k] = round(max(self.peaks.get(k, 0.0), v), 1)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(timeout=10)
        return dict(self.peaks)


def run_cell(out: str, groups: int, args: argparse.Namespace) -> dict:
    run_dir = os.path.join(out, f"g{groups}")
    argv = [
        sys.executable,
        os.path.join(REPO, "recipes", "drill.py"),
        "launcher=local_hosts",
        # 16 ranks, a standby and the fork servers on 2 cores: above the default guard of 4 per core.
        f"launcher.max_ranks_per_core={args.max_ranks_per_core}",
        f"ft.replica_groups={groups}",
        "ft.ranks_per_group=1",
        "chaos.tail_steps=5",
        faults_override(args.faults, groups, args.first_step, args.every),
        *([] if args.warm_fork else ["ft.warm_fork=false"]),
        *args.extra,
        f"hydra.run.dir={run_dir}",
    ]
    load_start = os.getloadavg()
    started = time.time()
    with open(run_dir + ".console.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        sampler = RssSampler(proc.pid, args.sample_s)
        try:
            code = proc.wait(timeout=args.cell_timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = proc.wait(timeout=120)
        rss = sampler.stop()
    meta = {
        "exit_code": code,
        "seconds": round(time.time() - started, 1),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }
    with open(os.path.join(run_dir, "rss_peaks.json"), "w") as f:
        json.dump({**rss, **{"_" + k: v for k, v in meta.items()}}, f, indent=2)
    return read_cell(run_dir, groups, meta)


def read_cell(run_dir: str, groups: int, meta: Optional[dict] = None) -> dict:
    """A cell's figures from its run directory (what ``--summarize`` reads)."""
    from monarch_ft.records.layout import read_json, read_jsonl

    drill = read_json(os.path.join(run_dir, "drill.json")) or {}
    summary = read_json(os.path.join(run_dir, "summary.json")) or {}
    rss_file = read_json(os.path.join(run_dir, "rss_peaks.json")) or {}
    meta = meta or {k[1:]: v for k, v in rss_file.items() if k.startswith("_")}
    rss = {k: v for k, v in rss_file.items() if not k.startswith("_")}
    cell = cell_figures(groups, drill, summary, read_jsonl(os.path.join(run_dir, "metrics.jsonl")), rss)
    cell["rss_per_group_mb"] = round(cell["rss_peak_mb"] / groups, 1) if cell.get("rss_peak_mb") else None
    return {**cell, **meta}


def fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def table(cells: list[dict]) -> str:
    head = (
        "| groups | faults recovered | MTTR p50 (s) | step p50 (s) | MTTR p50 (steps) | told p50 (s) | replacement up p50 (s) | stall p50 (s) | stall p95 (s) "
        "| controller CPU/tick (ms) | per group (ms) | controller CPU share | wall per tick (ms) "
        "| ticks | quorum p50 (ms) | quorum p95 (ms) | peak RSS (MB) | per group (MB) | load start / end | cell (s) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in sorted(cells, key=lambda c: c["groups"]):
        load = f"{fmt((c.get('load_start') or [None])[0], '.1f')} / {fmt((c.get('load_end') or [None])[0], '.1f')}"
        lines.append(
            f"| {c['groups']} | {c['recovered']}/{c['faults']} | {fmt(c['mttr_p50_s'])} | {fmt(c['step_p50_s'])} | {fmt(c['mttr_p50_steps'], '.1f')} "
            f"| {fmt(c['detected_p50_s'])} | {fmt(c['replacement_up_p50_s'])} | {fmt(c['stall_p50_s'])} | {fmt(c['stall_p95_s'])} "
            f"| {fmt(c['controller_cpu_per_tick_ms'], '.2f')} | {fmt(c['controller_cpu_per_tick_per_group_ms'], '.2f')} "
            f"| {fmt(c['controller_cpu_share'], '.2f')} | {fmt(c['controller_tick_ms'], '.0f')} "
            f"| {fmt(c['controller_ticks'], 'd')} | {fmt(c['quorum_p50_ms'], '.1f')} | {fmt(c['quorum_p95_ms'], '.1f')} | {fmt(c['rss_peak_mb'], '.0f')} "
            f"| {fmt(c['rss_per_group_mb'], '.0f')} | {load} | {fmt(c.get('seconds'), '.0f')} |"
        )
    return "\n".join(lines)


def write_outputs(out: str, cells: list[dict], meta: dict) -> None:
    with open(os.path.join(out, "scale.json"), "w") as f:
        json.dump({"meta": meta, "cells": cells}, f, indent=2)
    with open(os.path.join(out, "scale.md"), "w") as f:
        f.write(table(cells) + "\n\n" + closing_line(cells) + "\n")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 12.5))
    FigureCanvasAgg(fig)
    xs = sorted(c["groups"] for c in cells)
    by = {c["groups"]: c for c in cells}
    for i, (key, title) in enumerate(FIGURES):
        ax = fig.add_subplot(4, 3, i + 1)
        pts = [(x, by[x][key]) for x in xs if by[x].get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xticks(xs, [str(x) for x in xs])  # a linear axis: linear growth reads as a straight line
        ax.set_xlabel("replica groups")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.suptitle(f"scale: 1 rank per group, tiny model, simulated hosts ({meta.get('commit', '')})", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scale.png"), dpi=100)


class BenchClock:
    """The fake clock of ``--controller-only``: it moves when the loop sleeps, and by the CPU
    time the controller's own tick took (a tick that takes 30 ms delays the next by as much, as on
    a core of its own); the fake world acts between two ticks (:meth:`sleep`), so a tick's CPU is
    the controller's alone. CPU, not wall time: on a shared machine a tick's wall time is mostly
    its wait for a core, and a late tick finds more records, which made the figures the
    machine's load (a run beside a benchmark read a 1,024-group tick 6x slower)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self.world: Any = None

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.world is not None:
            self.world.advance()

    def advance(self, seconds: float) -> None:
        self.now += seconds


def controller_cell(n: int, steps: int, exit_step: int) -> dict[str, Any]:
    """One job of ``n`` groups x 1 rank on the fakes, ``steps`` steps, group 0's rank exiting at
    ``exit_step``: the controller's CPU per tick, the latency from the exit to the group's
    FailGroup action, the takeover state's bytes."""
    import socket
    import tempfile

    import numpy as np

    from monarch_ft.controller import actions as A
    from monarch_ft.controller.loop import TICK_S, Supervisor
    from monarch_ft.testing.fakes import FakeLauncher, Script, fake_job_config

    with tempfile.TemporaryDirectory(prefix=f"scale_fake{n}_") as d, socket.create_server(("127.0.0.1", 0)) as lighthouse:
        tokens = os.path.join(d, "tokens.npy")
        np.save(tokens, (np.arange(4096) % 1000).astype(np.uint16))
        cfg = fake_job_config(tokens, f"127.0.0.1:{lighthouse.getsockname()[1]}", ft__replica_groups=n, training__steps=steps)
        cfg.launcher.max_ranks_per_core = n  # nothing runs: the guard is for real ranks
        cfg.training.state_hash_every = 1  # as the drills: a state hash per committed step, kept 200 steps in the job's state
        # The tiny model's shape (model=tiny): nothing is built, but the memory check sizes the job by it.
        cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.vocab_size = 64, 2, 4, 2048
        clock = BenchClock()
        began = clock.now
        run_dir = os.path.join(d, "run")
        launcher = FakeLauncher(clock, run_dir, step_s=0.1)
        clock.world = launcher
        launcher.script(0, 0, Script(exit_at_step=exit_step))
        # The fake world's steps (and the exit) fall half a period after a tick starts: the mean
        # wait of an exit at a random time. Without it, a loop of short ticks at a fixed period
        # ticks exactly as each step falls due, and the exit's wait reads as nothing.
        joined = launcher.joined

        def joined_off_grid(rank, peer: bool) -> None:
            idle = launcher.next_step_at is None
            joined(rank, peer)
            if idle and launcher.next_step_at is not None:
                launcher.next_step_at += TICK_S / 2

        launcher.joined = joined_off_grid  # type: ignore[method-assign]
        journal: list = []
        sup = Supervisor(cfg, run_dir, launcher=launcher, echo=False, clock=clock, fork_server=launcher.fork_server, journal=journal)
        cpu: list[float] = []
        acted: list[tuple[float, float]] = []  # (fake time the tick began + its wall time so far, at each decision pass)
        tick = sup.tick
        act = sup._act

        def timed_act(now: float, actions: list):
            acted.append((now + time.process_time() - started[0], bool([a for a in actions if isinstance(a, A.FailGroup) and a.group == 0])))
            return act(now, actions)

        started = [0.0]

        def timed(now: float):
            started[0] = time.process_time()
            out = tick(now)
            cpu.append(time.process_time() - started[0])
            clock.advance(cpu[-1])
            return out

        sup.tick, sup._act = timed, timed_act  # type: ignore[method-assign]
        sup.run()
        state_bytes = sum(os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir) if f.startswith("controller.json"))
        failed_at = next((t for t, hit in acted if hit), None)
        due = launcher.step_due.get(exit_step)
    elapsed = clock.now - began
    cpu_ms = sorted(1000.0 * c for c in cpu)
    return {
        "groups": n,
        "ticks": len(cpu),
        "tick_cpu_p50_ms": round(cpu_ms[len(cpu_ms) // 2], 3),
        "tick_cpu_p99_ms": round(cpu_ms[min(len(cpu_ms) - 1, int(len(cpu_ms) * 0.99))], 3),
        "tick_cpu_max_ms": round(cpu_ms[-1], 3),
        "act_latency_ms": round(1000.0 * (failed_at - due), 1) if failed_at is not None and due is not None else None,
        "state_bytes": state_bytes,
        "busy_share": round(sum(cpu) / elapsed, 3) if elapsed > 0 else None,
    }


def controller_only(counts: list[int], steps: int) -> None:
    """The controller alone on the fakes, per group count (see the module docstring): a table,
    then one line for the largest count."""
    print("| groups | ticks | tick CPU p50 (ms) | p99 (ms) | max (ms) | exit -> action (ms, fake time) | takeover state (bytes) | busy (share of a core) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for n in counts:
        row = controller_cell(n, steps, exit_step=steps // 2)
        rows.append(row)
        print(
            f"| {n} | {row['ticks']} | {row['tick_cpu_p50_ms']:.2f} | {row['tick_cpu_p99_ms']:.2f} | {row['tick_cpu_max_ms']:.1f} | "
            f"{row['act_latency_ms']} | {row['state_bytes']} | {row['busy_share']} |",
            flush=True,
        )
    last = rows[-1]
    n = last["groups"]
    print(
        f"tick_cpu_p50_ms_{n}={last['tick_cpu_p50_ms']} tick_cpu_p99_ms_{n}={last['tick_cpu_p99_ms']} "
        f"act_latency_ms_{n}={last['act_latency_ms']} state_bytes_{n}={last['state_bytes']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="2,4,8,16", help="comma-separated group counts, one cell each (default 2,4,8,16)")
    ap.add_argument("--faults", type=int, default=3, help="faults per cell, process kill and node fault alternating (default 3)")
    ap.add_argument("--first-step", type=int, default=15, help="the first fault's step")
    ap.add_argument("--every", type=int, default=20, help="steps between faults (each recovers before the next)")
    ap.add_argument("--max-ranks-per-core", type=int, default=12, help="launcher.max_ranks_per_core for the cells")
    ap.add_argument("--warm-fork", action="store_true", help="keep the warm fork servers (one per simulated host)")
    ap.add_argument("--sample-s", type=float, default=0.5, help="how often the RSS sampler reads the processes")
    ap.add_argument("--cell-timeout-s", type=float, default=900, help="a cell still running after this is stopped")
    ap.add_argument("--out", default=None, help="where the cells' run directories and the results go (default outputs/scale/<time>)")
    ap.add_argument("--summarize", default=None, metavar="OUT", help="only print the table of an earlier run's cells")
    ap.add_argument(
        "--controller-only", default=None, metavar="COUNTS", help="the controller alone on the fake launcher at these group counts (e.g. 2,4,8,16,32,64)"
    )
    ap.add_argument("--steps", type=int, default=200, help="steps per --controller-only run")
    ap.add_argument("extra", nargs="*", help="more drill overrides for every cell (key=value)")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.groups.split(",") if x.strip()]
    except ValueError:
        print(f"monarch_ft: error: --groups={args.groups}: give comma-separated integers, e.g. --groups 2,4,8,16", file=sys.stderr)
        sys.exit(2)
    if not counts or min(counts) < 2:
        print("monarch_ft: error: --groups: every cell needs at least 2 groups (a fault needs a survivor), e.g. --groups 2,4", file=sys.stderr)
        sys.exit(2)
    if args.controller_only:
        try:
            only = [int(x) for x in args.controller_only.split(",") if x.strip()]
        except ValueError:
            print(f"monarch_ft: error: --controller-only={args.controller_only}: give comma-separated integers, e.g. 2,4,8,16", file=sys.stderr)
            sys.exit(2)
        controller_only(only, args.steps)
        return
    if args.summarize:
        cells = [read_cell(os.path.join(args.summarize, f"g{n}"), n) for n in counts if os.path.isdir(os.path.join(args.summarize, f"g{n}"))]
        from monarch_ft.records.layout import read_json

        write_outputs(args.summarize, cells, (read_json(os.path.join(args.summarize, "scale.json")) or {}).get("meta", {}))
        print(table(cells))
        print(closing_line(cells))
        return
    out = args.out or os.path.join(REPO, "outputs", "scale", time.strftime("%Y-%m-%d_%H-%M-%S"))
    os.makedirs(out, exist_ok=True)
    meta = {
        "commit": git_commit(REPO),
        "warm_fork": args.warm_fork,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "argv": sys.argv[1:],
        "cpus": os.cpu_count(),
    }
    print(f"[scale_bench] cells: {counts} groups x 1 rank, {args.faults} faults each; results in {out}", flush=True)
    cells: list[dict] = []
    started = time.time()
    for n in counts:
        cell = run_cell(out, n, args)
        cells.append(cell)
        write_outputs(out, cells, meta)
        print(
            f"[scale_bench {time.time() - started:5.0f}s] {n} groups: exit {cell['exit_code']}, recovered {cell['recovered']}/{cell['faults']}, "
            f"MTTR p50 {fmt(cell['mttr_p50_s'])} s, stall p50 {fmt(cell['stall_p50_s'])} s, "
            f"controller {fmt(cell['controller_cpu_per_tick_ms'], '.2f')} ms/tick, quorum p50 {fmt(cell['quorum_p50_ms'], '.1f')} ms, "
            f"peak RSS {fmt(cell['rss_peak_mb'], '.0f')} MB, load {cell['load_start'][0]:.1f}->{cell['load_end'][0]:.1f}",
            flush=True,
        )
    print(f"[scale_bench] {os.path.join(out, 'scale.md')}, {os.path.join(out, 'scale.png')}", flush=True)
    print(closing_line(cells), flush=True)


if __name__ == "__main__":
    main()
