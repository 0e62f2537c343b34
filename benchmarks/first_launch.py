"""A job's start, forked from the host's fork server or cold, side by side in one run.

    python benchmarks/first_launch.py                  # 3 rounds, 2 x 2 ranks of the tiny model
    python benchmarks/first_launch.py --rounds 5 --groups 4 --out outputs/first_launch

Arms (only ``ft.warm_fork`` differs; docs/design/standby-and-fork.md, "The first launch is forked too"):

- ``forked``: the default: each group's first launch waits for its host's fork server and forks its
  ranks from it (the host imports torch, TorchTitan and TorchFT once).
- ``cold``: ``ft.warm_fork=false``: every rank a fresh interpreter importing them itself.

Each round runs one short job per arm, interleaved (forked, cold, forked, ...) so the machine's load
falls on both alike. Per job, from ``events.jsonl``: seconds from ``job_started`` to
``training_started`` (every rank built and in its first quorum) and to the job's end; per arm the
median; then forked/cold ratios. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from monarch_ft.records.layout import read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = {"forked": [], "cold": ["ft.warm_fork=false"]}


def one_job(run_dir: str, groups: int, ranks: int, steps: int, extra: list[str]) -> dict:
    """Run one job to its end; its start-up figures from its event log."""
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = [sys.executable, os.path.join(REPO, "recipes", "pretrain.py"), "model=tiny", "training.seq_len=64", "training.batch_size=2"]
    argv += [f"ft.replica_groups={groups}", f"ft.ranks_per_group={ranks}", f"training.steps={steps}", *extra, f"hydra.run.dir={run_dir}"]
    started = time.time()
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    wall = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"first_launch: the job in {run_dir} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    t0 = events[0]["time"]
    at = {e["event"]: e["time"] - t0 for e in reversed(events)}  # each kind's first time
    launched = [e for e in events if e["event"] == "group_launched" and e["attempt"] == 0]
    return {"training_started_s": at["training_started"], "wall_s": wall, "forked": all(e.get("forked") for e in launched)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per group")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="", help="keep each job's run directory here (default: a temporary one, removed)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="first_launch_")
    rows: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm, extra in ARMS.items():
            row = one_job(os.path.join(out, f"{arm}_{r}"), args.groups, args.ranks, args.steps, extra)
            rows[arm].append(row)
            print(
                f"round {r + 1}/{args.rounds} {arm}: training from {row['training_started_s']:.2f} s, job {row['wall_s']:.1f} s, forked={row['forked']}",
                flush=True,
            )
    med = {arm: {k: statistics.median(x[k] for x in rs) for k in ("training_started_s", "wall_s")} for arm, rs in rows.items()}
    print("\n| arm | training from (s, median) | job wall (s, median) |\n|---|---|---|")
    for arm, m in med.items():
        print(f"| {arm} | {m['training_started_s']:.2f} | {m['wall_s']:.1f} |")
    ratio = med["forked"]["training_started_s"] / med["cold"]["training_started_s"]
    print(f"\nstart_ratio_forked_over_cold={ratio:.2f} wall_ratio_forked_over_cold={med['forked']['wall_s'] / med['cold']['wall_s']:.2f}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"args": vars(args), "rows": rows, "median": med}, f, indent=2)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
