"""The controller's own files cannot be written: the job stops cleanly, never with a traceback.

The run directory holds the controller's own files (events, metrics, the takeover state, the
control files, the ranks' specs). When its file system refuses a write mid-job (a full disk, a
read-only mount), the job stops with one ``monarch_ft: error:`` line naming the path and the
error, every group stopped, exit 1, the checkpoints (in a folder elsewhere) intact, and the job
resumes from them once the directory is writable again. A run directory that cannot be written at
all is refused before anything starts (exit 2).
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time

import pytest

from monarch_ft.records.manifest import complete_steps, step_dir, verify_step
from monarch_ft.testing.jobs import FAST, NO_STANDBY, PRETRAIN, REPO, console, finish_job, read_jsonl, run_job, start_job, wait_for

pytestmark = pytest.mark.slow

JOB = [*FAST, "ft.replica_groups=2", "ft.ranks_per_group=1", "checkpoint.interval=5", NO_STANDBY]


def _saved(ckpt, step: int):
    """Both groups saved a step at or after ``step``."""
    return lambda: all(complete_steps(str(ckpt / f"group_{g}")) and max(complete_steps(str(ckpt / f"group_{g}"))) >= step for g in (0, 1))


def _stopped_with_one_line(run_dir, code: int, error: str, under) -> str:
    """The job ended 1, with one error line naming ``error`` and a path under ``under``, no traceback."""
    out = console(run_dir)
    lines = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert code == 1 and len(lines) == 1, out[-4000:]
    assert f"cannot write the controller's own file {under}" in lines[0] and error in lines[0] and "checkpoint.resume=true" in lines[0], lines
    assert "Traceback" not in out, out[-4000:]
    return lines[0]


def _intact(ckpt) -> int:
    """Every complete step of both groups verifies against its manifest; the newest both have."""
    newest = []
    for g in (0, 1):
        folder = str(ckpt / f"group_{g}")
        steps = complete_steps(folder)
        assert steps and all(verify_step(step_dir(folder, s)) is None for s in steps), (folder, steps)
        newest.append(max(steps))
    return min(newest)


def test_a_full_run_directory_stops_the_job_cleanly_and_it_resumes(run_dir, tmp_path):
    """The run directory's disk fills up mid-job (its checkpoint folder is elsewhere)."""
    ckpt = tmp_path / "ckpt"
    run_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(run_dir)], check=True)
    try:
        proc = start_job(run_dir, *JOB, "training.steps=100000", f"checkpoint.folder={ckpt}")
        wait_for(_saved(ckpt, 10), 180, "both groups to save step 10")
        filled = 0
        with open(run_dir / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
                    filled += 1
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        code = finish_job(proc, run_dir, 120)
        _stopped_with_one_line(run_dir, code, "ENOSPC", run_dir)
        step = _intact(ckpt)
        # Room again: the job resumes from its newest checkpoint both groups hold, and finishes.
        (run_dir / "filler").unlink()
        assert run_job(run_dir, *JOB, f"training.steps={step + 5}", f"checkpoint.folder={ckpt}", "checkpoint.resume=true", timeout=180) == 0, console(run_dir)[
            -3000:
        ]
        resumed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "job_resumed"]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert resumed[-1]["step"] >= step and summary["status"] == "completed" and summary["weights_consistent"] is True, (resumed, summary)
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], check=False)


def test_a_read_only_run_directory_stops_the_job_cleanly(run_dir, tmp_path):
    """The run directory's control folder is remounted read-only mid-job (a bind mount of its
    own: the controller holds no file of it open, where a mount holding the event log could not
    be remounted at all); the controller's next write there is refused with EROFS."""
    ckpt = tmp_path / "ckpt"
    control = run_dir / "control"
    proc = start_job(run_dir, *JOB, "training.steps=100000", f"checkpoint.folder={ckpt}")
    mounted = False
    try:
        wait_for(_saved(ckpt, 10), 180, "both groups to save step 10")
        subprocess.run(["mount", "--bind", str(control), str(control)], check=True)
        mounted = True
        for _ in range(50):  # busy while a write there is under way: a moment later
            if subprocess.run(["mount", "-o", "remount,ro,bind", str(control)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("could not remount the control folder read-only")
        code = finish_job(proc, run_dir, 120)
        _stopped_with_one_line(run_dir, code, "EROFS", control)
        _intact(ckpt)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed", summary
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(control)], check=False)


def test_a_run_directory_that_cannot_be_written_is_refused_before_anything_starts(tmp_path):
    disk = tmp_path / "ro"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(disk)], check=True)
    try:
        res = subprocess.run([sys.executable, str(PRETRAIN), *FAST, f"hydra.run.dir={disk / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.strip() == (
            f"monarch_ft: error: hydra.run.dir={disk / 'run'}: cannot create or write it ({disk}: Read-only file system): "
            "give a writable directory with hydra.run.dir="
        ), res.stderr
    finally:
        subprocess.run(["umount", str(disk)], check=False)
