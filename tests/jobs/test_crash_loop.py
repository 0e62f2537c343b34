"""A crash loop is named, not ground through: a real job whose ranks fail the same way at start-up."""

from __future__ import annotations

import json
import time

import pytest

from monarch_ft.cli.jobctl import format_status, job_status
from monarch_ft.testing.jobs import FAST, console, events_of, run_job

pytestmark = pytest.mark.slow


def test_a_bad_model_past_the_preflight_check_stops_after_two_identical_failures_with_the_ranks_error(run_dir):
    # model.n_heads=64 with the tiny model's dim 64: validate accepts it (the heads divide the
    # dim), TorchTitan builds the model, and its rotary embedding rejects the head size of 1 (it
    # rotates pairs) in the first forward, before any step: on every launch of every group.
    # (Should validate ever refuse this combination, use another start-up failure it cannot
    # see, such as data.path removed after the job's data_ready.)
    started = time.time()
    code = run_job(run_dir, *FAST, "model.n_heads=64", "ft.replica_groups=2", "ft.ranks_per_group=1", "training.steps=20", timeout=240)
    seconds = time.time() - started
    out = console(run_dir)
    assert code == 1, out[-3000:]

    # Each group was launched twice, never a third time: stopped at the second identical
    # failure, long before ft.max_restarts=3 relaunches.
    for g in (0, 1):
        assert [e["attempt"] for e in events_of(run_dir, "group_launched", group=g)] == [0, 1], out[-3000:]
        assert len(events_of(run_dir, "restart_scheduled", group=g)) == 1
        loop = events_of(run_dir, "crash_loop", group=g)
        assert len(loop) == 1 and loop[0]["error_type"] == "RuntimeError", loop
        assert loop[0]["frame"].startswith("torchtitan/models/llama3/model/model.py:") and loop[0]["frame"].endswith(" in apply_rotary_emb"), loop
    # Both ranks' error, as each wrote it to its report before exiting: with the traceback in its log.
    errors = events_of(run_dir, "rank_error")
    assert len(errors) == 4 and all(e["error"].startswith("RuntimeError: shape '[2, 64, 64, -1, 2]' is invalid") for e in errors), errors
    assert not any(e["environmental"] for e in errors)
    assert "Traceback" in (run_dir / "logs" / "g0r0.a1.log").read_text()

    # The console: ONE error line, with the ranks' own error line, where it was raised and the fix;
    # the second group failing the same way does not print it again.
    lines = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(lines) == 1, out[-3000:]
    assert "RuntimeError: shape '[2, 64, 64, -1, 2]' is invalid for input of size" in lines[0]
    assert "in apply_rotary_emb" in lines[0] and "failed the same way on its last two launches" in lines[0]
    assert "fix the config or the data" in lines[0] and "Traceback" not in out

    # Every group gave up: the job failed (not degraded), and says why in its summary and status.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert all(grp["gave_up"] == "crash_loop" and grp["last_error"]["error_type"] == "RuntimeError" for grp in summary["groups"].values()), summary["groups"]
    status = format_status(job_status(str(run_dir)))
    assert status.startswith(f"job {run_dir}: failed")
    assert "group 1 given up, a crash loop" in status and "RuntimeError: shape" in status, status
    assert "not recovered yet" not in status, "a group given up is not on its way back"
    print(f"crash-loop job: {seconds:.1f} s")  # two launches of each group, not ft.max_restarts + 1
