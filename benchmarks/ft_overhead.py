"""What fault tolerance costs when nothing fails: no-FT HSDP against ft.mode=hsdp|localsgd|diloco.

    python benchmarks/ft_overhead.py                 # llama3 debugmodel, 100 steps, H=20
    python benchmarks/ft_overhead.py --size large    # a larger llama3 that still fits here
    python benchmarks/ft_overhead.py --smoke         # tiny model, a few steps (the test suite)

One run, same model, global batch, data, steps and hyper-parameters for every case:

1. ``no-FT``: plain PyTorch, no torchft anywhere (monarch_ft/recipes/noft_train.py, the goodput bench's
   no-FT reference too): 4 processes launched by torchrun (``torch.distributed.run --standalone``),
   a 2-D device mesh (replicate x shard) and TorchTitan's FSDP2 over it (HSDP), gloo;
2. ``hsdp``: ours, 2 groups x 2 ranks, the per-step cross-group allreduce through torchft;
3. ``localsgd`` / ``diloco`` (and streaming DiLoCo with ``--fragments``): ours, synced
   every H steps.

Per case: per-step time p50/p95 (after ``--warmup`` steps), tokens/s over the mean step
(sync steps included), its ratio to no-FT, the share of a step spent in quorum, in the
cross-group sync and in the rest (compute, FSDP inside the group), and the loss at the end
(mean of the group heads' last 10% of steps). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.recipes.noft_train import command as noft_command  # noqa: E402
from monarch_ft.records.layout import read_jsonl  # noqa: E402

SIZES = {
    # name: (model overrides, seq_len, steps, H)
    "smoke": ({"flavor": "debugmodel", "dim": 64, "n_layers": 2, "n_heads": 4}, 64, 20, 10),
    "debug": ({"flavor": "debugmodel"}, 128, 100, 20),
    "large": ({"flavor": "debugmodel", "dim": 512, "n_layers": 8, "n_heads": 8}, 128, 60, 20),
}


def _stats(times: list[float], quorum: list[float], xgroup: list[float], losses: list[float], tokens_per_step: int) -> dict:
    total = sum(times)
    return {
        "p50": statistics.median(times),
        "p95": sorted(times)[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))],
        "mean": total / len(times),
        "tokens_per_s": tokens_per_step * len(times) / total,
        "quorum": sum(quorum) / total if quorum else None,
        "xgroup": sum(xgroup) / total if xgroup else None,
        "loss": statistics.fmean(losses),
    }


def run_noft(args, spec: dict, out: str) -> dict:
    os.makedirs(out, exist_ok=True)
    spec = {**spec, "out": out}
    res = subprocess.run(noft_command(spec), cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if res.returncode != 0:
        raise RuntimeError(f"no-FT run failed ({res.returncode}): {res.stderr[-2000:]}")
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(spec["groups"] * spec["ranks"])]
    times = ranks[0]["times"][args.warmup :]
    tail = max(1, spec["steps"] // 10)
    losses = [loss for r in ranks if r["rank"] == 0 for loss in r["losses"][-tail:]]
    return _stats(times, [], [], losses, spec["global_tokens"])


def run_ours(args, spec: dict, overrides: list[str], out: str) -> dict:
    m = spec["model"]
    cmd = [
        sys.executable,
        os.path.join(REPO, "recipes", "pretrain.py"),
        f"ft.replica_groups={spec['groups']}",
        f"ft.ranks_per_group={spec['ranks']}",
        f"model.flavor={m['flavor']}",
        *(f"model.{k}={v}" for k, v in m.items() if k != "flavor"),
        f"training.seq_len={spec['seq_len']}",
        f"training.batch_size={spec['batch_size']}",
        f"training.steps={spec['steps']}",
        f"training.lr={spec['lr']}",
        f"training.warmup_steps={spec['warmup_steps']}",
        f"training.seed={spec['seed']}",
        # No warm standby: its one-time build in the background is not a per-step cost, and
        # on a small machine it would share the cores with the steps being timed.
        "checkpoint.enable=false",
        "ft.standby_groups=0",
        *overrides,
        f"hydra.run.dir={out}",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)} failed ({res.returncode}): {(res.stdout + res.stderr)[-2000:]}")
    recs = read_jsonl(os.path.join(out, "metrics.jsonl"))
    head = sorted((r for r in recs if r["group"] == 0 and r["rank"] == 0), key=lambda r: r["step"])[args.warmup :]
    tail = max(1, spec["steps"] // 10)
    trained = [r for r in recs if r["rank"] == 0 and r["loss"] is not None]
    losses = [r["loss"] for g in range(spec["groups"]) for r in sorted((r for r in trained if r["group"] == g), key=lambda r: r["step"])[-tail:]]
    stats = _stats(
        [r["step_time_s"] for r in head], [r.get("quorum_s", 0.0) for r in head], [r.get("xgroup_s", 0.0) for r in head], losses, spec["global_tokens"]
    )
    # A fault-free benchmark: a group the supervisor restarted makes the case not comparable.
    events = read_jsonl(os.path.join(out, "events.jsonl"))
    stats["failures"] = sum(1 for e in events if e["event"] == "group_failed")
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model, few steps (the test suite's size)")
    ap.add_argument("--size", choices=sorted(SIZES), default="debug")
    ap.add_argument("--steps", type=int, help="override the size's step count (a multiple of --sync-every)")
    ap.add_argument("--sync-every", type=int, help="H for localsgd/diloco (default: the size's)")
    ap.add_argument("--fragments", type=int, default=0, help="also run streaming DiLoCo with this many fragments")
    ap.add_argument("--modes", default="noft,hsdp,localsgd,diloco", help="comma-separated subset")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timings")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every case (interleaved); the median round counts")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--keep", help="directory for the runs (default: a temporary one, removed)")
    args = ap.parse_args()
    size = "smoke" if args.smoke else args.size
    model, seq_len, steps, h = SIZES[size]
    steps, h = args.steps or steps, args.sync_every or h
    if steps % h or (args.fragments and h % args.fragments):
        print(f"ft_overhead: error: --steps={steps} must be a multiple of --sync-every={h} (and H of --fragments)", file=sys.stderr)
        sys.exit(2)
    from monarch_ft.common.data import prepare

    data = prepare(None, 2048, 4.0)
    groups, ranks = 2, 2
    spec = {
        "model": {**model, "vocab_size": 2048},
        "seq_len": seq_len,
        "steps": steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "weight_decay": 0.1,
        "warmup_steps": 2,
        "seed": 0,
        "groups": groups,
        "ranks": ranks,
        "tokens_path": data.tokens_path,
        "global_tokens": groups * ranks * args.batch_size * seq_len,
    }
    cases = {
        "noft": None,
        "hsdp": ["ft.mode=hsdp"],
        "localsgd": ["ft.mode=localsgd", f"ft.sync_every={h}"],
        "diloco": ["ft.mode=diloco", f"ft.sync_every={h}"],
    }
    if args.fragments > 1:
        cases[f"diloco/{args.fragments}f"] = ["ft.mode=diloco", f"ft.sync_every={h}", f"ft.fragments={args.fragments}"]
    wanted = [c for c in cases if c.split("/")[0] in args.modes.split(",")]
    root = args.keep or tempfile.mkdtemp(prefix="ft_overhead-")
    rounds: dict[str, list[dict]] = {c: [] for c in wanted}
    for i in range(args.repeats):
        for c in wanted:
            out = os.path.join(root, f"{c.replace('/', '-')}-{i}")
            t = time.time()
            rounds[c].append(run_noft(args, spec, out) if cases[c] is None else run_ours(args, spec, cases[c], out))
            print(f"[ft_overhead] {c} round {i}: mean step {rounds[c][-1]['mean'] * 1e3:.1f} ms ({time.time() - t:.0f} s)", file=sys.stderr)
    res = {c: sorted(r, key=lambda x: x["mean"])[len(r) // 2] for c, r in rounds.items()}
    base = res.get("noft")
    # The machine's load drifts between cases: each case is compared with the no-FT run of
    # its own round, and the median of those ratios is reported.
    ratio = {c: statistics.median(x["mean"] / b["mean"] for x, b in zip(r, rounds["noft"])) for c, r in rounds.items()} if base else {}
    m = spec["model"]
    print(
        f"\nllama3 {m['flavor']}"
        + "".join(f" {k}={v}" for k, v in m.items() if k not in ("flavor", "vocab_size"))
        + f", seq {seq_len}, {groups} groups x {ranks} ranks, global batch {groups * ranks * args.batch_size}, {steps} steps, H={h}, "
        f"timings after {args.warmup} warm-up steps, median of {args.repeats} interleaved round(s); x no-FT: mean step "
        "over the same round's no-FT mean step (sync steps included)\n"
    )
    print("| case | p50 step (ms) | p95 step (ms) | tokens/s | x no-FT | quorum | cross-group | compute + rest | final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, r in res.items():
        labels = {"noft": "no-FT (torchrun HSDP)", "hsdp": "hsdp", "localsgd": f"localsgd H={h}", "diloco": f"diloco H={h}"}
        label = labels[c] if c in labels else f"diloco H={h} {c.split('/')[1]}"
        if any(x.get("failures") for x in rounds[c]):
            label += " (a group failed: not comparable)"
        x_noft = f"{ratio[c]:.3f}" if base else "n/a"
        q = f"{r['quorum'] * 100:.1f}%" if r["quorum"] is not None else "-"
        x = f"{r['xgroup'] * 100:.1f}%" if r["xgroup"] is not None else "-"
        rest = f"{(1 - (r['quorum'] or 0) - (r['xgroup'] or 0)) * 100:.1f}%"
        print(f"| {label} | {r['p50'] * 1e3:.1f} | {r['p95'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | {x_noft} | {q} | {x} | {rest} | {r['loss']:.3f} |")
    closing = []
    for c in ("hsdp", "localsgd", "diloco"):
        if c in res and base:
            closing.append(f"overhead_{c}={ratio[c]:.2f}")
    for c in ("localsgd", "diloco"):
        if c in res and "hsdp" in res:
            closing.append(f"loss_ratio_{c}={res[c]['loss'] / res['hsdp']['loss']:.2f}")
    print()
    print(" ".join(closing))
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
