"""A Hydra sweep (``-m``) of real jobs: every job runs, in its own directory, and the sweep tabulates them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import FAST, NO_STANDBY, PRETRAIN, REPO, read_jsonl
from monarch_ft.testing.wandb_offline import history, offline_runs

pytestmark = pytest.mark.slow


def test_a_two_job_sweep_runs_both_jobs_with_their_own_overrides(run_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    # Two groups of one rank, no standby, 8 steps: the least that still has a quorum of two.
    lrs = ("5e-3", "1e-5")
    argv = [sys.executable, str(PRETRAIN), "-m", *FAST, "ft.replica_groups=2", "ft.ranks_per_group=1", NO_STANDBY, "training.steps=8", "metrics.wandb=true"]
    argv += [f"training.lr={','.join(lrs)}", f"hydra.sweep.dir={run_dir}"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    losses = []
    for n, lr in enumerate(lrs):
        job = run_dir / str(n)
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["job_step"] == 8, summary
        assert summary["config"]["training"]["lr"] == float(lr)
        # What the ranks themselves trained with (their own records): the sweep's value, past the warm-up.
        records = [m for m in read_jsonl(job / "metrics.jsonl") if m["committed"]]
        assert max(m["lr"] for m in records) == pytest.approx(float(lr))
        # Each job its own Lighthouse, on its own port.
        assert len([e for e in read_jsonl(job / "events.jsonl") if e["event"] == "lighthouse_started"]) == 1
        losses.append([m["loss"] for m in sorted(records, key=lambda m: m["step"]) if m["group"] == 0][-1])
        # One W&B run per job (metrics.wandb, offline), not one per rank: the loss at every step.
        (wandb_run,) = offline_runs(str(job))
        assert [row["_step"] for row in history(wandb_run) if "loss" in row] == list(range(8))
    assert losses[0] != losses[1], "the two learning rates trained the same weights"

    table = [line.split("] ", 1)[1] for line in out.stdout.splitlines() if line.startswith("[monarch_ft sweep]")]
    assert table[0].startswith("2 jobs, 0 failed"), table
    assert table[1].split() == ["job", "overrides", "status", "final", "loss"], table
    for n, lr in enumerate(lrs):
        groups = json.loads((run_dir / str(n) / "summary.json").read_text())["groups"].values()
        mean = sum(g["last_loss"] for g in groups) / len(groups)
        assert table[2 + n].split() == [str(n), f"training.lr={float(lr)}", "completed", f"{mean:.4f}"], table
