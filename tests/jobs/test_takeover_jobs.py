"""The job outlives its controller and its Lighthouse: real jobs, real SIGKILLs.

Two short jobs (2 groups x 1 rank, the tiny model) cover: the Lighthouse SIGKILLed and
restarted with no group lost; the supervisor SIGKILLed while the ranks keep committing;
a rank killed while nobody supervises; a second controller refused; a new controller
attaching, restarting the lost group, and ``status``/``stacks``/``stop`` on the live job,
which then finishes with consistent weights and one summary; and a detached job that
nobody reattaches ending itself at its lease with a checkpoint and nothing left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.jobs import FAST, REPO, console, job_processes, read_jsonl, start_job, wait_for

# ft.quorum_timeout_s: the survivors' quorum in flight is retried at the restarted Lighthouse
# within it (rank.components.lighthouse_epoch); a stall that reaches it means it was waited out.
SMALL = [
    *FAST,
    "ft.replica_groups=2",
    "ft.ranks_per_group=1",
    "training.steps=100000",
    "checkpoint.interval=20",
    "training.state_hash_every=5",
    "ft.quorum_timeout_s=10",
]


def _state(run_dir: Path) -> dict:
    return RunLayout(str(run_dir)).read_controller_state()


def _committed(run_dir: Path, group: int, attempt: int = 0) -> int:
    """The newest step a group's rank 0 committed, from its own report file."""
    recs = read_jsonl(run_dir / "ranks" / f"g{group}r0.a{attempt}.jsonl")
    return max((r["step"] for r in recs if r.get("type") == "step" and r.get("committed")), default=-1)


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_ft", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _attach(run_dir: Path, name: str) -> subprocess.Popen:
    """A new controller taking the job in ``run_dir`` over; its console in ``<name>.console.log``."""
    argv = [sys.executable, str(REPO / "recipes" / "pretrain.py"), *SMALL, "controller.attach=true", f"hydra.run.dir={run_dir}"]
    log = open(run_dir.parent / f"{name}.console.log", "wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_job_survives_controller_and_lighthouse_kills(run_dir):
    first = start_job(run_dir, *SMALL)
    wait_for(lambda: min(_committed(run_dir, 0), _committed(run_dir, 1)) >= 5, 180, "both groups committing")

    # The Lighthouse: SIGKILLed, restarted on its address; no group fails, steps go on.
    lighthouse = _state(run_dir)["lighthouse"]
    os.kill(lighthouse["server_pid"], signal.SIGKILL)
    (recovered,) = wait_for(lambda: _events(run_dir, "lighthouse_recovered"), 90, "commits after the Lighthouse restart")
    restarted = _events(run_dir, "lighthouse_restarted")[0]
    assert restarted["address"] == lighthouse["address"] and restarted["pid"] != lighthouse["server_pid"]
    # The quorum in flight completed at the new Lighthouse (torchft's quorum_retries): with
    # quorum_retries=0 the ranks waited out ft.quorum_timeout_s and its TimeoutError ended them,
    # a group_failed each. None failed, and the job stepped on past the restart.
    assert not _events(run_dir, "group_failed"), console(run_dir)[-3000:]
    assert recovered["job_step"] > recovered["job_step_before"], recovered

    # The supervisor: SIGKILLed. Its ranks keep committing with nobody watching.
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    state = _state(run_dir)
    ranks = {g["index"]: g["ranks"][0]["pid"] for g in state["groups"]}
    at_kill = _committed(run_dir, 0)
    wait_for(lambda: _committed(run_dir, 0) >= at_kill + 5, 60, "ranks committing without a controller")
    status = _cli("status", str(run_dir))
    assert status.returncode == 0 and "running unsupervised" in status.stdout and "none attached" in status.stdout, status
    # A rank killed while unsupervised is restarted once a controller attaches.
    os.kill(ranks[1], signal.SIGKILL)

    second = _attach(run_dir, "attach")
    attached = wait_for(lambda: _events(run_dir, "controller_attached"), 120, "the new controller attached")[0]
    assert attached["groups"] == {"0": "adopt", "1": "fail"} and attached["unsupervised_s"] > 0, attached
    assert _events(run_dir, "controller_lost")[0]["pid"] == state["controller_pid"]
    # A second controller on the same run directory is refused, with one line.
    third = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "pretrain.py"), *SMALL, "controller.attach=true", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert third.returncode == 2 and third.stderr.strip().startswith("monarch_ft: error: another controller"), third.stderr
    assert len(third.stderr.strip().splitlines()) == 1, third.stderr
    # The adopted group was never restarted; the lost one heals from it and steps again.
    wait_for(lambda: _committed(run_dir, 1, attempt=1) >= 0, 150, "the lost group back after the attach")
    assert psutil_alive(ranks[0])

    status = _cli("status", str(run_dir))
    assert status.returncode == 0 and f"attached (pid {second.pid})" in status.stdout, status
    assert "controller_lost" in status.stdout and "lighthouse_lost" in status.stdout, status.stdout
    stacks = _cli("stacks", str(run_dir), "--group", "0")
    assert stacks.returncode == 0 and "g0r0" in stacks.stdout and "train" in stacks.stdout, stacks
    assert list((run_dir / "stacks").glob("cli-*/g0r0.txt"))
    bad = _cli("stacks", str(run_dir), "--group", "7")
    assert bad.returncode == 2 and bad.stderr.startswith("monarch_ft: error: --group 7"), bad.stderr

    # stop: every group finishes at one step, with a checkpoint; the job completes.
    stop = _cli("stop", str(run_dir))
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert second.wait(60) == 0, console(run_dir.parent / "attach")[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["weights_consistent"], summary
    assert summary["steps_lost"] == 0 and summary["groups"]["1"]["restarts"] == 1 and summary["groups"]["0"]["restarts"] == 0
    finish = _events(run_dir, "finish_requested")[-1]["step"]
    assert summary["job_step"] == finish and (run_dir / "checkpoint" / "group_0" / f"step-{finish}").is_dir()
    # One job in one log: started once, finished once, the whole wall time.
    assert len(_events(run_dir, "job_started")) == 1 and len(_events(run_dir, "job_finished")) == 1
    assert summary["wall_time_s"] > attached["unsupervised_s"]
    assert _cli("status", str(run_dir)).stdout.startswith(f"job {run_dir}: completed")


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.slow
def test_detached_job_ends_itself_at_its_lease(run_dir):
    job = start_job(run_dir, *SMALL, "controller.lease_s=6")
    wait_for(lambda: min(_committed(run_dir, 0), _committed(run_dir, 1)) >= 3, 180, "both groups committing")
    job.send_signal(signal.SIGUSR2)  # detach: the controller exits, the job keeps training
    assert job.wait(30) == 0, console(run_dir)[-3000:]
    assert _events(run_dir, "controller_detached") and not (run_dir / "summary.json").exists()
    at_detach = _committed(run_dir, 0)
    wait_for(lambda: _committed(run_dir, 0) > at_detach, 30, "training after the detach")
    # Nobody attaches: after lease_s every group finishes at one step, saves it, exits 0.
    wait_for(lambda: not job_processes(run_dir), 90, "the job ending itself")
    ended = [r for g in (0, 1) for r in read_jsonl(run_dir / "ranks" / f"g{g}r0.a0.jsonl") if r.get("event") == "controller_lease_ended"]
    assert {r["reason"] for r in ended} == {"lease_expired"} and len({r["finish_at"] for r in ended}) == 1, ended
    step = ended[0]["finish_at"]
    hashes = set()
    for g in (0, 1):
        assert (run_dir / "checkpoint" / f"group_{g}" / f"step-{step}").is_dir()
        finished = [r for r in read_jsonl(run_dir / "ranks" / f"g{g}r0.a0.jsonl") if r.get("event") == "rank_finished"]
        # Trained to that step (a finished group may still have served one more hold quorum).
        assert finished and finished[0]["steps_trained"] == step, finished
        hashes.add(finished[0]["state_hash"])
    assert len(hashes) == 1, "the groups ended with different weights"
    # Its last process (the Lighthouse guard) wrote the job's end, as a controller would have.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "lease_expired" and summary["weights_consistent"] and summary["job_step"] == step, summary
    assert {g["status"] for g in summary["groups"].values()} == {"done"} and summary["steps_lost"] == 0, summary["groups"]
    span = summary["controller"]["unsupervised"]
    assert summary["controller"]["ended_by_lease"] and len(span) == 1 and span[0]["ended_by"] == "lease_expired", summary["controller"]
    assert span[0]["steps_committed"] >= step - at_detach - 1 and span[0]["seconds"] > 6, span
    assert len(_events(run_dir, "job_started")) == 1 and _events(run_dir, "job_finished")[-1]["status"] == "lease_expired"
    out = _cli("status", str(run_dir)).stdout
    assert out.startswith(f"job {run_dir}: lease_expired") and "its lease ended it" in out, out
    time.sleep(0.5)
