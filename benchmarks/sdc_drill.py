"""Silent data corruption end to end: a drill of every such fault beside the same job with none.

    python benchmarks/sdc_drill.py                       # 3 groups x 1 rank, tiny llama3, 300 steps
    python benchmarks/sdc_drill.py --steps 400 --out outputs/sdc-bench

One invocation runs, one after the other, with the same model, data, seed and steps:

1. ``drill``: recipes/drill.py on 3 groups with a ``bitflip`` of the mantissa and one of the
   exponent (a weight every forward uses), a ``ckpt_corrupt`` truncation of one group's newest
   checkpoint and a same-size rewrite of every group's, and a ``process_kill``; ending at
   ``training.steps`` (not a tail after the last fault), so both runs train the same steps;
2. ``clean``: recipes/pretrain.py, the same job with no fault.

Printed: per fault, the step it landed in, the step it was caught at and the latency in steps,
its MTTR, whether it recovered with equal weights; the drill's exit code; NaN or inf in any
step record of a replica that was not the corrupt one (none allowed); and the mean loss of
every group over the last 50 steps of each run, side by side, with their ratio. Numbers are
printed; the closing line says whether the drill met its bar (exit 0, every fault recovered
with equal weights, no NaN, the loss within 5%), and the script exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.layout import read_jsonl  # noqa: E402

WQ = "model.layers.0.attention.wq.weight"
FAULTS = (
    "chaos.faults=["
    "{kind: bitflip, bit: mantissa, at_step: 20, target: 1}, "
    f"{{kind: bitflip, bit: exponent, tensor: {WQ}, at_step: 40, target: 2}}, "
    "{kind: ckpt_corrupt, mode: truncate, at_step: 60, target: 0}, "
    "{kind: ckpt_corrupt, mode: rewrite, all_groups: true, at_step: 80, target: 1}, "
    "{kind: process_kill, at_step: 100, target: 0}]"
)
# The drill's training (monarch_ft/configs/drill_common.yaml), spelled out for the clean run's recipe.
JOB = [
    "model=tiny",
    "training.seq_len=64",
    "training.batch_size=2",
    "training.lr=5e-3",
    "training.warmup_steps=5",
    "training.state_hash_every=1",
    "ft.timeout_s=3",
    "ft.replica_groups=3",
    "ft.ranks_per_group=1",
    "ft.standby_groups=0",
    "checkpoint.interval=10",
    "checkpoint.scrub_every_s=5",
]
# The drill only: a damaged step must outlive a scrub pass to be found. With 2 kept steps (the
# default) a step saved every 10 steps is purged ~20 steps after it was written, a few seconds
# here, and a ckpt_corrupt could be purged unseen (harmless, but never detected: not recovered).
DRILL_ONLY = ["checkpoint.keep_latest_k=5"]


def _run(recipe: str, run: str, extra: list[str]) -> tuple[int, float]:
    started = time.time()
    with open(run + ".console.log", "wb") as log:
        argv = [sys.executable, os.path.join(REPO, "recipes", recipe), *JOB, *extra, f"hydra.run.dir={run}"]
        code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    return code, time.time() - started


def mean_loss(metrics: list[dict], first: int, last: int) -> float:
    """Every group's rank 0, committed steps [first, last), each (group, step) once."""
    seen: dict[tuple[int, int], float] = {}
    for m in sorted(metrics, key=lambda m: m["time"]):
        if m["rank"] == 0 and m.get("committed") and first <= m["step"] < last and m.get("loss") is not None:
            seen.setdefault((m["group"], m["step"]), m["loss"])
    return statistics.mean(seen.values()) if seen else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="sdc-drill-")
    os.makedirs(out, exist_ok=True)
    steps = [f"training.steps={args.steps}"]
    drill_dir, clean_dir = os.path.join(out, "drill"), os.path.join(out, "clean")
    code, took = _run("drill.py", drill_dir, [*steps, *DRILL_ONLY, FAULTS, "chaos.tail_steps=100000"])
    print(f"[sdc_drill] drill exited {code} in {took:.0f}s ({drill_dir})", flush=True)
    clean_code, clean_took = _run("pretrain.py", clean_dir, steps)
    print(f"[sdc_drill] clean run exited {clean_code} in {clean_took:.0f}s ({clean_dir})", flush=True)
    if not os.path.exists(os.path.join(drill_dir, "drill.json")) or clean_code != 0:
        raise SystemExit(f"sdc_drill: error: a run did not finish; see {drill_dir}.console.log and {clean_dir}.console.log")

    drill = json.load(open(os.path.join(drill_dir, "drill.json")))
    events = read_jsonl(os.path.join(drill_dir, "events.jsonl"))
    metrics = read_jsonl(os.path.join(drill_dir, "metrics.jsonl"))
    print()
    print("| fault | target | landed at step | caught at step | latency (steps) | detected (s) | MTTR (s) | recovered | weights equal |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for f in drill["faults"]:
        label = f"{f['kind']}:{f['mode']}" if f.get("mode") else f["kind"]
        ph = f.get("phases") or {}
        print(
            f"| {label} | {f['target']} | {f.get('hit_step', '-')} | {f.get('detected_step', '-')} | {f.get('detection_latency_steps', '-')} | "
            f"{ph.get('detected')} | {f.get('mttr_s')} | {f.get('recovered')} | {f.get('weights_consistent')} |"
        )
    # The corrupt replicas: the attempts a bitflip landed in (their NaN is the fault itself).
    corrupt = {(e["group"], e["attempt"]) for e in events if e["event"] == "bitflip_injected"}
    healthy = [m for m in metrics if (m["group"], m["attempt"]) not in corrupt]
    bad = [m for m in healthy if any(m.get(k) is not None and not math.isfinite(m[k]) for k in ("loss", "grad_norm"))]
    ours = mean_loss(metrics, args.steps - 50, args.steps)
    clean = mean_loss(read_jsonl(os.path.join(clean_dir, "metrics.jsonl")), args.steps - 50, args.steps)
    ratio = ours / clean
    interval = [e["every"] for e in events if e["event"] == "integrity_interval"]
    print()
    print(f"ft.integrity_every=auto chose {interval[-1] if interval else 1}; NaN or inf in a healthy replica's records: {len(bad)}")
    print(f"mean loss over steps {args.steps - 50}-{args.steps - 1}: drill {ours:.4f}, clean {clean:.4f}, ratio {ratio:.4f}")
    ok = (
        code == 0
        and all(f.get("recovered") and f.get("weights_consistent") is not False for f in drill["faults"])
        and drill["weights_consistent"]
        and not bad
        and abs(ratio - 1) <= 0.05
    )
    latencies = [f.get("detection_latency_steps") for f in drill["faults"] if f.get("detection_latency_steps") is not None]
    print(
        f"closing: ok={ok} drill_exit={code} faults={len(drill['faults'])} recovered={sum(1 for f in drill['faults'] if f.get('recovered'))} "
        f"max_latency_steps={max(latencies, default=None)} nan_in_healthy={len(bad)} loss_ratio={ratio:.4f} runs={out}"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
