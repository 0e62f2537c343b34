"""What the silent-data-corruption checks cost on a clean job, and whether they ever cry wolf.

    python benchmarks/integrity_overhead.py                  # 3 groups x 1 rank, tiny llama3, 1000 steps
    python benchmarks/integrity_overhead.py --steps 200      # shorter
    python benchmarks/integrity_overhead.py --smoke          # 30 steps (a quick look)

One invocation runs the same fault-free job twice, side by side (same model, data, seed,
steps), with the cases interleaved over ``--repeats`` rounds so that the machine's load
drifts across both alike:

- ``off``: ``ft.integrity_every=0 ft.grad_check=false`` (no fingerprints, no gradient check);
- ``on``: ``ft.integrity_every=1 ft.grad_check=true`` (a fingerprint of every rank's state at
  every step, the most it can cost, and the gradient check on every step).

Printed per case: the wall time per step (p50, p95; from consecutive step records of each
rank: everything a step costs, the fingerprint included), and for ``on``: the fingerprint's
own time over the step's own time (per step, median and p95: the load-independent measure),
the interval ``ft.integrity_every=auto`` would choose from those same measurements
(controller.integrity.choose_interval), the gradient check's false votes (``grad_outlier``
events and vetoed steps: a clean job must have none) and how close the largest gradient norm
came to its outlier bar (norm / median of the previous ``ft.grad_history`` committed norms).
Also, measured in this process on the same model: the bytes of one rank's state and what an
in-memory copy of it would cost per step (a clone), against a fingerprint of it. Numbers are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.layout import read_jsonl  # noqa: E402

JOB = [
    "model=tiny",
    "training.seq_len=64",
    "training.batch_size=2",
    "training.lr=5e-3",
    "training.warmup_steps=5",
    "ft.replica_groups=3",
    "ft.ranks_per_group=1",
    "ft.standby_groups=0",
    "ft.warm_fork=false",
    "checkpoint.enable=false",
]
CASES = {
    "off": ["ft.integrity_every=0", "ft.grad_check=false"],
    "on": ["ft.integrity_every=1", "ft.grad_check=true"],
}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def run_case(name: str, steps: int, out_dir: str) -> dict:
    run = os.path.join(out_dir, name)
    os.makedirs(out_dir, exist_ok=True)
    argv = [sys.executable, os.path.join(REPO, "recipes", "pretrain.py"), *JOB, *CASES[name], f"training.steps={steps}", f"hydra.run.dir={run}"]
    started = time.time()
    with open(run + ".console.log", "wb") as log:
        code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"integrity_overhead: error: the {name} job exited {code}; see {run}.console.log")
    metrics = read_jsonl(os.path.join(run, "metrics.jsonl"))
    events = read_jsonl(os.path.join(run, "events.jsonl"))
    walls: list[float] = []
    last: dict[tuple, float] = {}
    for m in sorted(metrics, key=lambda m: m["time"]):
        key = (m["group"], m["rank"], m["attempt"])
        if key in last and m["step"] >= 5:
            walls.append(m["time"] - last[key])
        last[key] = m["time"]
    ratios = [m["fingerprint_s"] / m["step_time_s"] for m in metrics if m.get("fingerprint_s") is not None and m.get("step_time_s") and m["step"] >= 5]
    # The gradient check's margin: each norm over the median of the committed norms before it.
    margin = 0.0
    history: dict[tuple, deque] = {}
    for m in sorted(metrics, key=lambda m: m["time"]):
        if m.get("grad_norm") is None:
            continue
        seen = history.setdefault((m["group"], m["rank"], m["attempt"]), deque(maxlen=50))
        if len(seen) >= 10:
            margin = max(margin, m["grad_norm"] / statistics.median(seen))
        if m.get("committed"):
            seen.append(m["grad_norm"])
    return {
        "case": name,
        "seconds": round(time.time() - started, 1),
        "steps": max((m["step"] for m in metrics), default=-1) + 1,
        "wall_p50_ms": 1e3 * _pct(walls, 0.5),
        "wall_p95_ms": 1e3 * _pct(walls, 0.95),
        "wall_mean_ms": 1e3 * statistics.mean(walls) if walls else float("nan"),
        "fp_share_p50": _pct(ratios, 0.5) if ratios else None,
        "fp_share_p95": _pct(ratios, 0.95) if ratios else None,
        "fp_ms_p50": 1e3 * _pct([m["fingerprint_s"] for m in metrics if m.get("fingerprint_s") is not None], 0.5) if ratios else None,
        "ratios": ratios,
        "fingerprints": sum(1 for m in metrics if m.get("fingerprint")),
        "false_votes": sum(1 for e in events if e["event"] == "grad_outlier"),
        "vetoed_steps": len({m["step"] for m in metrics if m.get("vetoed_by")}),
        "sdc_verdicts": sum(1 for e in events if e["event"] in ("sdc_detected", "group_suspect")),
        "grad_margin": margin,
        "committed_steps": len({m["step"] for m in metrics if m.get("committed")}),
    }


def copy_cost(repeats: int = 20) -> dict:
    """One rank's state of the same model, in this process: its bytes, a fingerprint of it, a clone of it."""
    import torch
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    from monarch_ft.config.model import ModelConfig
    from monarch_ft.rank.components.integrity import fingerprint
    from monarch_ft.rank.components.model import build_model

    torch.set_num_threads(1)
    model = build_model(ModelConfig(name="llama3", flavor="debugmodel", dim=64, n_layers=2, n_heads=4, vocab_size=2048), 64, None, torch.device("cpu"), 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _init_optim_state(opt)
    state = {"model": dict(model.named_parameters()), "optim": {n: opt.state[p] for n, p in model.named_parameters()}}
    tensors = [t for t in list(state["model"].values()) + [v for s in state["optim"].values() for v in s.values()] if isinstance(t, torch.Tensor)]
    fp, clone = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fingerprint(state)
        t1 = time.perf_counter()
        copies = [t.detach().clone() for t in tensors]
        t2 = time.perf_counter()
        fp.append(t1 - t0)
        clone.append(t2 - t1)
        del copies
    size = sum(t.numel() * t.element_size() for t in tensors)
    return {"bytes": size, "fingerprint_ms": 1e3 * statistics.median(fp), "clone_ms": 1e3 * statistics.median(clone)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of (off, on), interleaved")
    parser.add_argument("--smoke", action="store_true", help="30 steps")
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    steps = 30 if args.smoke else args.steps
    out = args.out or tempfile.mkdtemp(prefix="integrity-overhead-")
    os.makedirs(out, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in CASES}
    for r in range(args.repeats):
        for name in CASES:
            res = run_case(name, steps, os.path.join(out, f"round{r}"))
            results[name].append(res)
            print(f"[integrity_overhead] round {r} {name}: {res['steps']} steps in {res['seconds']}s, wall p50 {res['wall_p50_ms']:.1f} ms", flush=True)

    from monarch_ft.controller.integrity import choose_interval

    print()
    print("| case | steps | wall p50 (ms) | wall p95 (ms) | wall mean (ms) | fingerprint / step p50 | p95 | fingerprints | false votes | vetoed steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        for res in runs:
            share = f"{res['fp_share_p50']:.2%}" if res["fp_share_p50"] is not None else "-"
            p95 = f"{res['fp_share_p95']:.2%}" if res["fp_share_p95"] is not None else "-"
            print(
                f"| {name} | {res['steps']} | {res['wall_p50_ms']:.1f} | {res['wall_p95_ms']:.1f} | {res['wall_mean_ms']:.1f} | {share} | {p95} | "
                f"{res['fingerprints']} | {res['false_votes']} | {res['vetoed_steps']} |"
            )
    on, off = results["on"], results["off"]
    wall = statistics.median(a["wall_p50_ms"] / b["wall_p50_ms"] for a, b in zip(on, off))
    mean = statistics.median(a["wall_mean_ms"] / b["wall_mean_ms"] for a, b in zip(on, off))
    ratios = [x for res in on for x in res["ratios"]]
    every, why = choose_interval(ratios, 0.01)
    cost = copy_cost()
    print()
    print(f"auto would choose ft.integrity_every={every}: {why}")
    votes, committed, margin = sum(r["false_votes"] for r in on), sum(r["committed_steps"] for r in on), max(r["grad_margin"] for r in on)
    print(f"gradient check: {votes} false votes over {committed} committed steps; largest norm / median of the previous ones = {margin:.2f} (the bar: 10)")
    print(
        f"one rank's state: {cost['bytes'] / 1e6:.2f} MB; in this process a fingerprint of it takes {cost['fingerprint_ms']:.2f} ms, "
        f"a clone (an in-memory copy to roll back to) {cost['clone_ms']:.2f} ms and as many bytes again"
    )
    print(
        f"closing: wall_ratio_p50_on_off={wall:.3f} wall_ratio_mean_on_off={mean:.3f} fingerprint_share_p50={statistics.median(ratios):.4f} "
        f"auto_every={every} false_votes={sum(r['false_votes'] for r in on)} vetoed_steps={sum(r['vetoed_steps'] for r in on)} "
        f"sdc_verdicts={sum(r['sdc_verdicts'] for r in on)} runs={out}"
    )


if __name__ == "__main__":
    main()
