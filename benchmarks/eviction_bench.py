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
checkpoint save next to the fault); the fault-to-survivors-stepping phase; MTTR; each as p50 and p95
with their 95% bootstrap intervals, the max and n (monarch_ft.records.stats); then after/before ratios
of the p50s. Every fault counts: one injected and never recovered keeps its stall in the stall figures
(it has no MTTR), and is counted as not recovered; one that never fired, and a drill that failed
(it is reported, and the bench goes on), are counted too. ``--summarize OUT`` prints them again from a
run's directories. Printed, never asserted; ``--out`` keeps each drill's run directory and a ``summary.json``.
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

from monarch_ft.records.stats import spread  # noqa: E402

ARMS = {
    "before": ["ft.heartbeat_timeout_ms=1000", "ft.heartbeat_interval_ms=100"],
    "after": [],
}
KINDS = ("process_kill", "node")


def faults_override(n: int, first_step: int = 15, every: int = 20) -> str:
    entries = [f"{{kind: {KINDS[i % len(KINDS)]}, at_step: {first_step + i * every}, target: {(i // len(KINDS) + i) % 2}}}" for i in range(n)]
    return "chaos.faults=[" + ", ".join(entries) + "]"


def run_drill(run_dir: str, arm: str, faults: int) -> tuple[list[dict], bool]:
    """One drill of ``arm``: (its faults as drill.json has them, whether the drill failed)."""
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
        try:
            code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
        except subprocess.TimeoutExpired:
            code = None
    return drill_faults(run_dir), code != 0


def drill_faults(run_dir: str) -> list[dict]:
    """The faults of a drill's drill.json (none if the drill left none)."""
    path = os.path.join(run_dir, "drill.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["faults"]


def summarize(rows: dict[str, list[dict]], failed_drills: dict[str, int] | None = None) -> dict:
    """Per arm: how many faults and what became of them, and the spreads (n, p50 and p95 with their
    intervals, max) of the survivors' longest stall (every injected fault, recovered or not), of the
    fault-to-survivors-stepping phase and of MTTR (recovered faults: the others have none).

    Args:
        rows: each arm's faults, as drill.json has them (injected or not).
        failed_drills: each arm's drills that exited non-zero (reported; their faults are in ``rows``).
    """
    summary = {}
    for arm, faults in rows.items():
        fired = [f for f in faults if f.get("injected")]
        summary[arm] = {
            "faults": len(faults),
            "recovered": sum(1 for f in fired if f.get("recovered") is True),
            "not_recovered": sum(1 for f in fired if f.get("recovered") is not True),
            "not_injected": len(faults) - len(fired),
            "failed_drills": (failed_drills or {}).get(arm, 0),
            "stall_s": spread(f.get("survivor_max_stall_s") for f in fired).as_dict(),
            "survivors_stepping_s": spread((f.get("phases") or {}).get("survivors_stepping") for f in fired).as_dict(),
            "mttr_s": spread(f.get("mttr_s") for f in fired if f.get("recovered") is True).as_dict(),
            "stall_p50_by_kind": {k: spread(f.get("survivor_max_stall_s") for f in fired if f["kind"] == k).p50 for k in KINDS},
        }
    return summary


def _text(s: dict) -> str:
    """``p50 x [lo, hi], p95 y [lo, hi], max z, n=k`` of a spread's dict."""
    from monarch_ft.records.stats import Spread

    return Spread(**{k: tuple(v) if k.endswith("_ci") and v is not None else v for k, v in s.items()}).text(3)


def print_summary(summary: dict, out: str) -> None:
    for arm, s in summary.items():
        print(
            f"{arm}: {s['faults']} faults, {s['recovered']} recovered, {s['not_recovered']} not recovered, "
            f"{s['not_injected']} never fired, {s['failed_drills']} drill(s) failed"
        )
        print(f"  survivors' stall (s): {_text(s['stall_s'])}")
        print(f"  survivors stepping (s): {_text(s['survivors_stepping_s'])}")
        print(f"  MTTR (s): {_text(s['mttr_s'])}")
        print("  stall p50 by kind (s): " + ", ".join(f"{k} {v:.3f}" for k, v in s["stall_p50_by_kind"].items() if v is not None))
    b, a = summary.get("before"), summary.get("after")
    if not (a and b):
        return
    ratio = lambda key, q: (  # noqa: E731
        f"{a[key][q] / b[key][q]:.2f}" if a[key][q] is not None and b[key][q] else "n/a"
    )
    print(
        f"after/before: stall p50 {ratio('stall_s', 'p50')}, stall p95 {ratio('stall_s', 'p95')}, "
        f"survivors stepping p50 {ratio('survivors_stepping_s', 'p50')}, MTTR p50 {ratio('mttr_s', 'p50')} (run directories: {out})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="drills per arm, interleaved")
    ap.add_argument("--faults", type=int, default=4, help="faults per drill (process kill and node fault alternate)")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temporary folder)")
    ap.add_argument("--summarize", default=None, metavar="OUT", help="only print the summary of an earlier run's directories")
    args = ap.parse_args()
    if args.summarize:
        rows = {arm: [] for arm in ARMS}
        for run_dir in sorted(glob.glob(os.path.join(args.summarize, "*-*"))):
            arm = os.path.basename(run_dir).split("-", 1)[1]
            if os.path.isdir(run_dir) and arm in rows:
                rows[arm] += drill_faults(run_dir)
        print_summary(summarize(rows), args.summarize)
        return
    out = args.out or tempfile.mkdtemp(prefix="eviction_bench_")
    os.makedirs(out, exist_ok=True)
    rows: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    failed = dict.fromkeys(ARMS, 0)
    started = time.time()
    for r in range(args.rounds):
        for arm in ARMS:
            faults, broke = run_drill(os.path.join(out, f"{r}-{arm}"), arm, args.faults)
            rows[arm] += faults
            failed[arm] += int(broke)
            stalls = ", ".join(
                f"{f['kind']} {f['survivor_max_stall_s']:.3f}" + ("" if f.get("recovered") else " (NOT RECOVERED)")
                if f.get("injected")
                else f"{f['kind']} never fired"
                for f in faults
            )
            note = f" (the drill FAILED: {os.path.join(out, f'{r}-{arm}')}.console.log)" if broke else ""
            print(
                f"[eviction_bench {time.time() - started:5.0f}s] round {r + 1}/{args.rounds} {arm}: survivors' stall (s) {stalls or 'none'}{note}", flush=True
            )
    summary = summarize(rows, failed)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print_summary(summary, out)


if __name__ == "__main__":
    main()
