"""What writing the takeover state costs per tick: the journal against rewriting it whole.

    python benchmarks/takeover_state_bench.py                    # 16, 128 and 1024 groups
    python benchmarks/takeover_state_bench.py --groups 16,128 --steps 200

The real watch loop on the fake launcher and clock (as ``scale_bench.py --controller-only``:
every group steps each 0.1 s of fake time, a state hash every committed step, kept 200 steps),
with ``Takeover.save`` wrapped: at every save, side by side on the same state,

- **journal**: the save as the controller does it (:mod:`monarch_ft.records.journal`: what
  changed appended to ``controller.journal``, the base rewritten when the journal outgrows it);
- **told the groups**: the same save told which groups may have changed (``Takeover.save``'s
  ``groups``), as a tick that knows which reports grew and which processes changed would tell it
  (here: each group's report offsets, rank processes, exit codes, status and attempt, compared
  with the previous save's), into a run directory of its own; every 50th save checks its files
  against the whole snapshot (``Takeover.check``: the hint missed nothing);
- **whole**: what the controller did before, the whole snapshot encoded and written atomically
  (``json.dumps`` of ``Takeover.snapshot`` to a file beside it).

Per group count: CPU per save (p50, p99, mean: this thread's CPU time, the fake ranks' writes
not included), bytes written per save (mean), and the takeover state's bytes on disk (the base
and its journal: at the end, and the largest seen at a save), with the whole snapshot's size.
The loop is run once per group count; ``--steps`` sets its length (the state hashes kept grow
with it up to 200 steps). Ends with one line:
``save_cpu_p50_ms_<G>=… whole_cpu_p50_ms_<G>=… bytes_per_save_<G>=… state_bytes_<G>=…`` for the
largest G. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def run(groups: int, steps: int, whole_every: int = 1) -> dict:
    """One loop of ``groups`` groups for ``steps`` steps; the figures of its saves."""
    import numpy as np

    from monarch_ft.controller.loop import Supervisor
    from monarch_ft.controller.takeover import Takeover
    from monarch_ft.records.layout import RunLayout, atomic_write
    from monarch_ft.testing.fakes import FakeClock, FakeLauncher, fake_job_config

    with tempfile.TemporaryDirectory(prefix=f"takeover{groups}_") as d, socket.create_server(("127.0.0.1", 0)) as lighthouse:
        tokens = os.path.join(d, "tokens.npy")
        np.save(tokens, (np.arange(4096) % 1000).astype(np.uint16))
        cfg = fake_job_config(tokens, f"127.0.0.1:{lighthouse.getsockname()[1]}", ft__replica_groups=groups, training__steps=steps)
        cfg.launcher.max_ranks_per_core = groups  # nothing runs: the guard is for real ranks
        cfg.training.state_hash_every = 1
        clock = FakeClock()
        run_dir = os.path.join(d, "run")
        launcher = FakeLauncher(clock, run_dir, step_s=0.1)
        sup = Supervisor(cfg, run_dir, launcher=launcher, echo=False, clock=clock, fork_server=launcher.fork_server)
        takeover = sup.takeover
        journal = takeover.journal
        # The same saves told which groups changed, into a run directory of their own.
        os.makedirs(os.path.join(d, "hinted"))
        hinted = Takeover(cfg.controller, RunLayout(os.path.join(d, "hinted")), clock)
        whole_path = os.path.join(d, "whole.json")
        real_save = takeover.save
        seen: dict[int, tuple] = {}
        fig: dict[str, list[float]] = {
            k: [] for k in ("save_ms", "save_bytes", "state_bytes", "whole_ms", "whole_bytes", "hint_ms", "hinted_ms", "hinted_bytes")
        }

        def changed_groups(state) -> list[int]:
            """What a tick knows without looking at the state: a group whose reports grew, whose
            rank exited or was replaced, whose status or attempt moved."""
            out = []
            for g in state.groups:
                sig = (g.status, g.attempt, tuple((id(rs.proc), rs.tail.position if rs.tail else None, rs.exited) for rs in g.ranks))
                if seen.get(g.index) != sig:
                    seen[g.index] = sig
                    out.append(g.index)
            return out

        def save(state, finished=False, changed=None):
            written = journal.written_bytes
            t0 = time.thread_time()
            real_save(state, finished, changed)
            t1 = time.thread_time()
            n = len(fig["save_ms"])
            if n % whole_every == 0 or finished:
                text = json.dumps(takeover.snapshot(state, finished), default=str)
                atomic_write(whole_path, text)
                t2 = time.thread_time()
                fig["whole_ms"].append((t2 - t1) * 1e3)
                fig["whole_bytes"].append(len(text))
            t2 = time.thread_time()
            touched = changed_groups(state)
            t3 = time.thread_time()
            hinted_written = hinted.journal.written_bytes
            hinted.save(state, finished, touched)
            t4 = time.thread_time()
            if n % 50 == 0:
                hinted.check(state, finished)  # the hint missed nothing (raises if it did)
            fig["save_ms"].append((t1 - t0) * 1e3)
            fig["save_bytes"].append(journal.written_bytes - written)
            fig["state_bytes"].append(journal.size())
            fig["hint_ms"].append((t3 - t2) * 1e3)
            fig["hinted_ms"].append((t4 - t3) * 1e3)
            fig["hinted_bytes"].append(hinted.journal.written_bytes - hinted_written)
            if (n + 1) % 100 == 0:
                print(f"  [{groups} groups] {n + 1} saves, step {state.job_step}/{steps}", flush=True)

        takeover.save = save
        code = sup.run()
        if code != 0:
            raise SystemExit(f"monarch_ft: error: the fake job of {groups} groups ended with exit code {code}")
        # The last save is a job's end (a new base): the steady state is the saves before it.
        steady = {k: (v[:-1] if k != "whole_ms" or len(v) > 1 else v) for k, v in fig.items()}
        return {
            "groups": groups,
            "saves": len(steady["save_ms"]),
            "compactions": journal.compactions,
            "save_cpu_p50_ms": percentile(steady["save_ms"], 50),
            "save_cpu_p99_ms": percentile(steady["save_ms"], 99),
            "save_cpu_mean_ms": sum(steady["save_ms"]) / len(steady["save_ms"]),
            "bytes_per_save": sum(steady["save_bytes"]) / len(steady["save_bytes"]),
            "state_bytes_max": max(steady["state_bytes"]),
            "state_bytes_end": journal.size(),
            "whole_cpu_p50_ms": percentile(steady["whole_ms"], 50),
            "whole_cpu_p99_ms": percentile(steady["whole_ms"], 99),
            "whole_bytes_end": fig["whole_bytes"][-1],
            "whole_every": whole_every,
            "hinted_cpu_p50_ms": percentile(steady["hinted_ms"], 50),
            "hinted_cpu_p99_ms": percentile(steady["hinted_ms"], 99),
            "hinted_cpu_mean_ms": sum(steady["hinted_ms"]) / len(steady["hinted_ms"]),
            "hint_cpu_p50_ms": percentile(steady["hint_ms"], 50),
            "hinted_bytes_per_save": sum(steady["hinted_bytes"]) / len(steady["hinted_bytes"]),
        }


def table(rows: list[dict]) -> str:
    out = [
        "| groups | saves | compactions | journal: CPU/save p50 / p99 / mean (ms) | bytes/save (mean) | state on disk, largest / at end (bytes) "
        "| told the groups: CPU/save p50 / p99 / mean (ms) | whole: CPU/save p50 / p99 (ms) | whole: bytes/save |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['groups']} | {r['saves']} | {r['compactions']} | {r['save_cpu_p50_ms']:.2f} / {r['save_cpu_p99_ms']:.2f} / {r['save_cpu_mean_ms']:.2f} "
            f"| {r['bytes_per_save']:.0f} | {r['state_bytes_max']} / {r['state_bytes_end']} "
            f"| {r['hinted_cpu_p50_ms']:.2f} / {r['hinted_cpu_p99_ms']:.2f} / {r['hinted_cpu_mean_ms']:.2f} "
            f"| {r['whole_cpu_p50_ms']:.2f} / {r['whole_cpu_p99_ms']:.2f} | {r['whole_bytes_end']} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="16,128,1024", help="comma-separated group counts (default 16,128,1024)")
    ap.add_argument("--steps", type=int, default=200, help="steps of each loop (default 200: the state hashes kept reach their 200 steps)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--whole-every", type=int, default=10, help="the whole-snapshot reference at every Kth save only (default 10) ...")
    ap.add_argument("--whole-every-from", type=int, default=512, help="... from this many groups on (default 512: it costs half a second a save there)")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.groups.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2 or args.steps < 10:
        print("monarch_ft: error: give --groups as comma-separated integers >= 2 (e.g. 16,128) and --steps >= 10", file=sys.stderr)
        sys.exit(2)
    rows = []
    for n in counts:
        started = time.time()
        print(f"[takeover_state_bench] {n} groups x {args.steps} steps ...", flush=True)
        rows.append(run(n, args.steps, args.whole_every if n >= args.whole_every_from else 1))
        print(f"[takeover_state_bench] {n} groups done in {time.time() - started:.0f} s", flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    last = rows[-1]
    g = last["groups"]
    print(
        f"save_cpu_p50_ms_{g}={last['save_cpu_p50_ms']:.2f} save_cpu_p99_ms_{g}={last['save_cpu_p99_ms']:.2f} "
        f"told_cpu_p50_ms_{g}={last['hinted_cpu_p50_ms']:.2f} whole_cpu_p50_ms_{g}={last['whole_cpu_p50_ms']:.2f} "
        f"bytes_per_save_{g}={last['bytes_per_save']:.0f} state_bytes_{g}={last['state_bytes_max']}"
    )


if __name__ == "__main__":
    main()
