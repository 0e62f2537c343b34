"""The survivors' stall at a fault, before and after proactive eviction, side by side in one run.

    python benchmarks/eviction_bench.py                      # 2 rounds x (2 process kills + 2 node faults) per arm
    python benchmarks/eviction_bench.py --rounds 1 --faults 2 --out outputs/eviction

Arms (only the Lighthouse heartbeat settings differ; docs/design/eviction.md):

- ``before``: ``ft.heartbeat_timeout_ms=1000`` with Managers heartbeating every 100 ms (the previous
  defaults): the Lighthouse counts a dead group healthy for a second.
- ``after``: the defaults (``ft.heartbeat_timeout_ms=200``, ``ft.heartbeat_interval_ms=50``).

Each round runs one drill per arm, interleaved (before, after, before, ...) so the machine's load falls
on both alike: 2 groups x 1 rank, the tiny model, ``--faults`` faults alternating process kill and node
fault, alternating target group. Per arm: the survivors' longest stall between committed steps around
each fault (chaos.mttr's ``survivor_max_stall_s``, which also holds the survivor's own step and any
checkpoint save next to the fault), p50/p95; the fault-to-survivors-stepping phase p50/p95; MTTR p50;
then after/before ratios. ``--summarize OUT`` prints them again from a run's directories.
Printed, never asserted; ``--out`` keeps each drill's run directory and a ``summary.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

ARMS = {
    "before": ["ft.heartbeat_timeout_ms=1000", "ft.heartbeat_interval_ms=100"],
    "after": [],
}
KINDS = ("process_kill", "node")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))


def faults_override(n: int, first_step: int = 15, every: int = 20) -> str:
    entries = [f"{{kind: {KINDS[i % len(KINDS)]}, at_step: {first_step + i * every}, target: {(i // len(KINDS) + i) % 2}}}" for i in range(n)]
    return "chaos.faults=[" + ", ".join(entries) + "]"


def run_drill(run_dir: str, arm: str, faults: int) -> dict:
    argv = [
        sys.executable,
        os.path.join(REPO, "recipes", "drill.py"),
        "ft.replica_groups=2",
        "ft.ranks_per_group=1",
        "chaos.tail_steps=5",
        faults_override(faults),
        *ARMS[arm],
        f"hydra.run.dir={run_dir}",
    ]
    with open(run_dir + ".console.log", "wb") as log:
        code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
    if code != 0:
        raise SystemExit(f"eviction_bench: the {arm} drill failed (exit {code}); its console: {run_dir}.console.log")
    with open(os.path.join(run_dir, "drill.json")) as f:
        return json.load(f)


def summarize(rows: dict[str, list[dict]]) -> dict:
    """Per arm: the survivors' longest stall (p50/p95, and p50 per kind), the fault-to-survivors-stepping
    phase (p50/p95: the part eviction shortens, without the survivor's own step around it) and MTTR p50."""
    summary = {}
    for arm, faults in rows.items():
        stalls = [f["survivor_max_stall_s"] for f in faults]
        stepping = [f["phases"]["survivors_stepping"] for f in faults if f["phases"].get("survivors_stepping") is not None]
        summary[arm] = {
            "faults": len(faults),
            "stall_p50_s": percentile(stalls, 50),
            "stall_p95_s": percentile(stalls, 95),
            "survivors_stepping_p50_s": percentile(stepping, 50),
            "survivors_stepping_p95_s": percentile(stepping, 95),
            "mttr_p50_s": percentile([f["mttr_s"] for f in faults], 50),
            "stall_p50_by_kind": {k: percentile([f["survivor_max_stall_s"] for f in faults if f["kind"] == k], 50) for k in KINDS},
        }
    return summary


def print_summary(summary: dict, out: str) -> None:
    print(f"{'arm':8} {'faults':>6} {'stall p50 (s)':>14} {'stall p95 (s)':>14} {'stepping p50':>13} {'stepping p95':>13} {'MTTR p50 (s)':>13}  by kind")
    for arm, s in summary.items():
        kinds = ", ".join(f"{k} {v:.3f}" for k, v in s["stall_p50_by_kind"].items() if v is not None)
        print(
            f"{arm:8} {s['faults']:>6} {s['stall_p50_s']:>14.3f} {s['stall_p95_s']:>14.3f} {s['survivors_stepping_p50_s']:>13.3f} "
            f"{s['survivors_stepping_p95_s']:>13.3f} {s['mttr_p50_s']:>13.3f}  {kinds}"
        )
    b, a = summary["before"], summary["after"]
    print(
        f"after/before: stall p50 {a['stall_p50_s'] / b['stall_p50_s']:.2f}, stall p95 {a['stall_p95_s'] / b['stall_p95_s']:.2f}, "
        f"survivors stepping p50 {a['survivors_stepping_p50_s'] / b['survivors_stepping_p50_s']:.2f}, "
        f"MTTR p50 {a['mttr_p50_s'] / b['mttr_p50_s']:.2f} (run directories: {out})"
    )


def recovered_faults(drill: dict) -> list[dict]:
    return [f for f in drill["faults"] if f.get("injected") and f.get("recovered")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="drills per arm, interleaved")
    ap.add_argument("--faults", type=int, default=4, help="faults per drill (process kill and node fault alternate)")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temporary folder)")
    ap.add_argument("--summarize", default=None, metavar="OUT", help="only print the summary of an earlier run's directories")
    args = ap.parse_args()
    if args.summarize:
        rows = {arm: [] for arm in ARMS}
        for path in sorted(glob.glob(os.path.join(args.summarize, "*-*", "drill.json"))):
            arm = os.path.basename(os.path.dirname(path)).split("-", 1)[1]
            with open(path) as f:
                rows[arm] += recovered_faults(json.load(f))
        print_summary(summarize(rows), args.summarize)
        return
    out = args.out or tempfile.mkdtemp(prefix="eviction_bench_")
    os.makedirs(out, exist_ok=True)
    rows: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    started = time.time()
    for r in range(args.rounds):
        for arm in ARMS:
            faults = recovered_faults(run_drill(os.path.join(out, f"{r}-{arm}"), arm, args.faults))
            rows[arm] += faults
            stalls = ", ".join(f"{f['kind']} {f['survivor_max_stall_s']:.3f}" for f in faults)
            print(f"[eviction_bench {time.time() - started:5.0f}s] round {r + 1}/{args.rounds} {arm}: survivors' stall (s) {stalls}", flush=True)
    summary = summarize(rows)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print_summary(summary, out)


if __name__ == "__main__":
    main()
