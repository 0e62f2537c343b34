"""Loss curves through a fault, ``ft.global_batch=constant`` against ``shrink``, each against its
fault-free run, side by side in one run.

    python benchmarks/global_batch_bench.py                       # seeds 0 and 1, 600 steps, kill at 150
    python benchmarks/global_batch_bench.py --seeds 0 --steps 300 --kill-at 80 --out outputs/gb
    python benchmarks/global_batch_bench.py --summarize outputs/gb  # the tables and plot again

Per seed, four jobs (2 groups x 1 rank, the tiny llama3, ``training.seq_len=64``, no standby),
interleaved so the machine's load falls on all alike: each policy fault-free, and each with group 1
SIGKILLed when group 0 has committed ``--kill-at`` steps and relaunched ``--backoff`` seconds later
(``ft.restart_backoff_s``, then a warm fork and a heal). A step's loss is the mean over every slot
it trained (records.global_batch: each committed record's loss, weighted by its slots). Per policy
and seed: the steps trained with one group, the distinct ``global_tokens`` of the committed steps,
the slots of the fault-free run the fault run skipped or repeated, and |loss(fault) - loss(fault-free)|
per step after the kill (mean, max) and over the last 50 steps. Printed, never asserted; the run
directories, ``summary.json`` and ``loss.png`` go to ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.global_batch import GlobalBatch, consumed  # noqa: E402
from monarch_ft.records.layout import read_jsonl  # noqa: E402  (a line still being written is skipped)

POLICIES = (GlobalBatch.CONSTANT, GlobalBatch.SHRINK)
COMMON = [
    "model=tiny",
    "training.seq_len=64",
    "training.batch_size=2",
    "training.lr=5e-3",
    "ft.hang_timeout_s=20",
    "ft.replica_groups=2",
    "ft.ranks_per_group=1",
    "ft.standby_groups=0",
    "checkpoint.enable=false",
]


def run_job(run_dir: str, policy: GlobalBatch, seed: int, steps: int, kill_at: int | None, backoff: float) -> None:
    """One job to its end; with ``kill_at``, group 1's rank is SIGKILLed once group 0 committed that many steps."""
    argv = [
        sys.executable,
        os.path.join(REPO, "recipes", "pretrain.py"),
        *COMMON,
        f"training.steps={steps}",
        f"training.seed={seed}",
        f"ft.global_batch={policy.value}",
        f"ft.restart_backoff_s={backoff}",
        f"hydra.run.dir={run_dir}",
    ]
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    with open(run_dir + ".console.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if kill_at is not None:
            metrics, events = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "events.jsonl")
            while proc.poll() is None and sum(1 for m in read_jsonl(metrics) if m["group"] == 0 and m["committed"]) < kill_at:
                time.sleep(0.02)
            ranks = [e for e in read_jsonl(events) if e["event"] == "rank_launched" and e["group"] == 1]
            if ranks and proc.poll() is None:
                os.kill(ranks[-1]["pid"], signal.SIGKILL)
        code = proc.wait(timeout=900)
    if code != 0:
        raise SystemExit(f"global_batch_bench: {run_dir} failed (exit {code}); its console: {run_dir}.console.log")


def step_losses(metrics: list[dict]) -> dict[int, float]:
    """Each committed step's loss over every slot it trained (records weighted by their slots)."""
    total: dict[int, float] = {}
    slots: dict[int, int] = {}
    for m in metrics:
        if m["committed"] and m.get("loss") is not None and m.get("slots"):
            k = len(m["slots"])
            total[m["step"]] = total.get(m["step"], 0.0) + m["loss"] * k
            slots[m["step"]] = slots.get(m["step"], 0) + k
    return {s: total[s] / slots[s] for s in sorted(total)}


def analyse(out: str, seed: int, policy: GlobalBatch) -> dict:
    """The fault run of ``policy`` and ``seed`` against its fault-free run."""
    clean = read_jsonl(os.path.join(out, f"s{seed}-{policy.value}-clean", "metrics.jsonl"))
    fault = read_jsonl(os.path.join(out, f"s{seed}-{policy.value}-fault", "metrics.jsonl"))
    ref, got = step_losses(clean), step_losses(fault)
    alone = sorted({m["step"] for m in fault if m["committed"] and m["group"] == 0 and m["participating_groups"] == [0]})
    killed = alone[0] if alone else None
    after = [s for s in got if killed is not None and s >= killed and s in ref]
    diffs = [abs(got[s] - ref[s]) for s in after]
    tail = [abs(got[s] - ref[s]) for s in sorted(ref)[-50:] if s in got]
    expected = consumed(clean, 2, policy)
    trained = consumed(fault, 2, policy)
    missing = sum(len(set(v) - set(trained.get(s, []))) for s, v in expected.items())
    repeated = sum(len(v) - len(set(v)) for v in trained.values())
    return {
        "seed": seed,
        "policy": policy.value,
        "steps": len(got),
        "steps_with_one_group": len(alone),
        "fault_span": [alone[0], alone[-1]] if alone else None,
        "global_tokens": sorted({m["global_tokens"] for m in fault if m["committed"]}),
        "slots_skipped": missing,
        "slots_repeated": repeated,
        "dloss_after_kill_mean": sum(diffs) / len(diffs) if diffs else None,
        "dloss_after_kill_max": max(diffs) if diffs else None,
        "dloss_last50_mean": sum(tail) / len(tail) if tail else None,
        "loss_last50_clean": sum(ref[s] for s in sorted(ref)[-50:]) / min(50, len(ref)),
        "loss_last50_fault": sum(got[s] for s in sorted(got)[-50:]) / min(50, len(got)),
        "clean_final_hash": _final_hash(os.path.join(out, f"s{seed}-{policy.value}-clean")),
    }


def _final_hash(run_dir: str) -> str | None:
    finished = [e for e in read_jsonl(os.path.join(run_dir, "events.jsonl")) if e["event"] == "rank_finished" and e["group"] == 0]
    return finished[-1]["state_hash"] if finished else None


def plot(out: str, seed: int, rows: list[dict]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(curve: dict[int, float], k: int = 10) -> tuple[list[int], list[float]]:
        steps = sorted(curve)
        vals = [curve[s] for s in steps]
        return steps, [sum(vals[max(0, i - k + 1) : i + 1]) / len(vals[max(0, i - k + 1) : i + 1]) for i in range(len(vals))]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    colors = {"constant": "tab:blue", "shrink": "tab:red"}
    for policy in POLICIES:
        clean = step_losses(read_jsonl(os.path.join(out, f"s{seed}-{policy.value}-clean", "metrics.jsonl")))
        fault = step_losses(read_jsonl(os.path.join(out, f"s{seed}-{policy.value}-fault", "metrics.jsonl")))
        top.plot(*smooth(clean), color=colors[policy.value], alpha=0.45, lw=1, ls="--", label=f"{policy.value}, fault-free")
        top.plot(*smooth(fault), color=colors[policy.value], lw=1.2, label=f"{policy.value}, group 1 killed")
        steps = [s for s in sorted(fault) if s in clean]
        bottom.plot(steps, [fault[s] - clean[s] for s in steps], color=colors[policy.value], lw=0.8, label=policy.value)
    for row in rows:
        if row["seed"] == seed and row["fault_span"]:
            a, b = row["fault_span"]
            for ax in (top, bottom):
                ax.axvspan(a, b, color=colors[row["policy"]], alpha=0.08)
    top.set_ylabel("loss (moving mean of 10 steps)")
    top.set_title(f"2 groups x 1 rank, tiny llama3, seed {seed}: group 1 out in the shaded steps")
    top.legend(fontsize=8)
    bottom.axhline(0, color="black", lw=0.5)
    bottom.set_ylabel("loss(fault) - loss(fault-free)")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "loss.png")
    fig.savefig(path, dpi=110)
    return path


def print_rows(rows: list[dict]) -> None:
    print(
        f"{'policy':9} {'seed':>4} {'steps':>5} {'one group':>9} {'global_tokens':>14} "
        f"{'skipped':>7} {'repeated':>8} {'|dloss| mean':>12} {'max':>7} {'last50':>7}"
    )
    for r in rows:
        print(
            f"{r['policy']:9} {r['seed']:>4} {r['steps']:>5} {r['steps_with_one_group']:>9} {str(r['global_tokens']):>14} {r['slots_skipped']:>7} "
            f"{r['slots_repeated']:>8} {r['dloss_after_kill_mean']:>12.4f} {r['dloss_after_kill_max']:>7.4f} {r['dloss_last50_mean']:>7.4f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kill-at", type=int, default=150, help="group 0's committed steps before group 1 is killed")
    ap.add_argument("--backoff", type=float, default=6.0, help="ft.restart_backoff_s: how long group 1 stays out, roughly")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temporary folder)")
    ap.add_argument("--summarize", default=None, metavar="OUT", help="only analyse an earlier run's directories")
    args = ap.parse_args()
    out = args.summarize or args.out or tempfile.mkdtemp(prefix="global_batch_bench_")
    if not args.summarize:
        os.makedirs(out, exist_ok=True)
        started = time.time()
        for seed in args.seeds:
            for fault in (False, True):
                for policy in POLICIES:
                    name = f"s{seed}-{policy.value}-{'fault' if fault else 'clean'}"
                    run_job(os.path.join(out, name), policy, seed, args.steps, args.kill_at if fault else None, args.backoff)
                    print(f"[global_batch_bench {time.time() - started:5.0f}s] {name} done", flush=True)
    seeds = sorted({int(os.path.basename(p).split("-")[0][1:]) for p in glob.glob(os.path.join(out, "s*-*-fault"))})
    rows = [analyse(out, seed, policy) for seed in seeds for policy in POLICIES]
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print_rows(rows)
    print(f"plot: {plot(out, seeds[0], rows)}; run directories: {out}")


if __name__ == "__main__":
    main()
