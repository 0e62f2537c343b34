"""launcher=monarch: real Monarch proc meshes and actors on this machine (no mocks)."""

from __future__ import annotations

import json
import os
import signal
import threading
import subprocess
import sys
import time
from pathlib import Path

import monarch.actor  # noqa: E402,F401  (a hard dependency: a broken install fails here, it is not skipped)
import psutil
import pytest

from monarch_ft.config.launcher import LauncherConfig  # noqa: E402
from monarch_ft.controller.loop import request_finish  # noqa: E402
from monarch_ft.launcher import RankLaunch, build_launcher  # noqa: E402
from monarch_ft.testing.jobs import FAST, REPO, assert_weights_agree_after, console, events_of, finish_job, processes_matching, read_jsonl, start_job, wait_for

TESTS = Path(__file__).resolve().parent


def trivial_rank(spec_path: str) -> int:
    """Entry of the trivial ranks (runs inside a Monarch proc): report, then sleep and return, or raise."""
    with open(spec_path) as f:
        spec = json.load(f)
    print(f"trivial rank {spec['rank']} pid {os.getpid()}", flush=True)
    with open(spec["mark"] + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "env": os.environ.get("MFT_TEST_VAR"), "cwd": os.getcwd(), "omp": os.environ.get("OMP_NUM_THREADS")}, f)
    os.replace(spec["mark"] + ".tmp", spec["mark"])
    time.sleep(spec["sleep"])
    if spec.get("fail"):
        raise RuntimeError(f"trivial rank {spec['rank']} fails as asked")
    return 0


def monarch_procs() -> list[psutil.Process]:
    """Live Monarch procs (bootstrap_main) spawned by this process or its children."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any("bootstrap_main" in a for a in p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def all_monarch_procs() -> set[int]:
    """Every live Monarch proc on the machine (by command line), wherever its parent is."""
    return {p.pid for p in processes_matching("monarch._src.actor.bootstrap_main")}


def _ranks(run_dir: Path, attempt: int, sleeps: list[float], fail: tuple[int, ...] = ()) -> list[RankLaunch]:
    out = []
    for r, sleep in enumerate(sleeps):
        spec = run_dir / f"r{r}.a{attempt}.json"
        spec.write_text(json.dumps({"rank": r, "sleep": sleep, "mark": str(run_dir / f"r{r}.a{attempt}.mark"), "fail": r in fail}))
        env = dict(os.environ, MFT_TEST_VAR=f"v{r}", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]))
        out.append(
            RankLaunch(
                group=0,
                rank=r,
                attempt=attempt,
                argv=[sys.executable, "-m", "monarch_ft.rank.worker", str(spec)],
                env=env,
                log_path=str(run_dir / "logs" / f"g0r{r}.a{attempt}.log"),
                cwd=str(run_dir),
                extra={"monarch_entry": f"{Path(__file__).stem}:trivial_rank"},
            )
        )
    return out


def _niceness_of_threads(pid: int) -> frozenset:
    """Every niceness among the threads of ``pid`` (/proc/<pid>/task/<tid>/stat field 19)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return frozenset(out)


def _steps(metrics, group):
    return [m for m in metrics if m["group"] == group and m["rank"] == 0 and m["committed"]]


@pytest.mark.slow
def test_sigkilled_actor_proc_is_reported_and_kill_leaves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launcher = build_launcher(LauncherConfig(name="monarch", options={}), str(run_dir))
    try:
        procs = launcher.launch_group(_ranks(run_dir, 0, [120, 120]))
        assert launcher.describe()["launcher"] == "monarch"
        pids = [p.pid for p in procs]
        assert all(pids) and len(set(pids)) == 2 and os.getpid() not in pids
        marks = [wait_for(lambda r=r: (run_dir / f"r{r}.a0.mark").exists(), 60, f"rank {r} to run") for r in range(2)]
        assert all(marks)
        for r in range(2):
            mark = json.loads((run_dir / f"r{r}.a0.mark").read_text())
            # The rank's env, cwd and pid are those of the actor's own process.
            assert mark == {"pid": pids[r], "env": f"v{r}", "cwd": str(run_dir), "omp": "1"}
        assert [p.poll() for p in procs] == [None, None]

        procs[1].send_signal(signal.SIGKILL)
        # Supervision reports the death, with its signal, while its peer runs on. How soon is
        # the recovery's detect phase, measured by the drills (docs/results), not bounded here.
        assert procs[1].wait(60) == -signal.SIGKILL
        assert procs[0].poll() is None, "the other rank keeps running until the group is killed"

        for p in procs:
            p.kill()
        assert [p.wait(15) for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        wait_for(lambda: not monarch_procs(), 15, "every Monarch proc to exit")
        assert "trivial rank 0" in (run_dir / "logs" / "g0r0.a0.log").read_text(), "rank output goes to its log"

        # The group relaunches as a fresh mesh; ranks that return exit 0 and the mesh goes away.
        again = launcher.launch_group(_ranks(run_dir, 1, [0, 0]))
        assert {p.pid for p in again}.isdisjoint(pids)
        assert [p.wait(60) for p in again] == [0, 0]
        wait_for(lambda: not monarch_procs(), 30, "the finished group's procs to exit")

        # A rank whose train() raises is an actor error, not a process exit: once every rank's
        # verdict is in, the launcher ends the mesh itself (nobody else would: the controller
        # stops only ranks still running), so no proc is left holding the failed rank's
        # sockets open and its TorchFT Manager heartbeating. Nothing here calls kill().
        failed = launcher.launch_group(_ranks(run_dir, 2, [0, 0], fail=(1,)))
        assert [p.wait(60) for p in failed] == [0, 1]
        wait_for(lambda: not monarch_procs(), 30, "the failed group's procs to be ended")
    finally:
        launcher.close()
    assert not monarch_procs()
    # No watcher is left inside Monarch's native wait: the interpreter's exit would kill it
    # there and abort the process after a clean job (a CI run's exit -6).
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("watch-", "stop-", "signal-"))]


@pytest.mark.slow
@pytest.mark.long(2)
def test_pretrain_on_monarch_sigkilled_rank_restarts_and_heals_then_a_standby_mesh_takes_over(run_dir):
    """One job, two faults on group 1: the first while the warm standby (a proc mesh of its
    own, ft.standby_groups=1) is still building respawns the group's mesh (cold, healed from
    the peer); the second, once the standby is ready, promotes it (issue 10: each launcher
    promotes a standby). At the end no Monarch proc of the job is left."""
    before = all_monarch_procs()
    proc = start_job(
        run_dir,
        *FAST,
        "launcher=monarch",
        "ft.replica_groups=2",
        "ft.ranks_per_group=2",
        "training.steps=100000",
        "training.state_hash_every=1",
        "ft.standby_groups=1",
        # Not a test of startup hangs: groups and standbys start slowly on 2 shared, loaded cores.
        "ft.startup_timeout_s=600",
    )
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    try:
        # Both groups stepping in one quorum (a fault with no live peer left would lose the job).
        wait_for(lambda: len([m for m in _steps(read_jsonl(metrics_path), 1) if len(m["participating_groups"]) == 2]) >= 5, 300, "group 1 to step with group 0")
        victim = [e for e in read_jsonl(events_path) if e["event"] == "rank_launched" and e["group"] == 1 and e["rank"] == 1][-1]
        assert victim["pid"] and victim["pid"] != proc.pid
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: events_of(run_dir, "group_stepping", group=1, attempt=1), 300, "group 1 back (cold)")
        wait_for(lambda: events_of(run_dir, "standby_ready", standby=0), 300, "the standby mesh ready")
        # The standby's mesh is spawned in the background (its pids come with its reports).
        standby_pids = [read_jsonl(run_dir / "ranks" / f"sb0r{r}.jsonl")[0]["pid"] for r in (0, 1)]
        # A waiting standby runs below the training ranks (its proc, every thread of it).
        assert {_niceness_of_threads(pid) for pid in standby_pids} == {frozenset({10})}
        (again,) = events_of(run_dir, "rank_launched", group=1, rank=0, attempt=1)
        os.kill(again["pid"], signal.SIGKILL)
        wait_for(lambda: events_of(run_dir, "group_stepping", group=1, attempt=2), 120, "group 1 back (standby)")
        commits = lambda: [m for m in read_jsonl(metrics_path) if m["group"] == 1 and m["attempt"] == 2 and m["committed"]]  # noqa: E731
        wait_for(lambda: len(commits()) >= 6, 120, "commits after the promotion")
        # Well ahead: metrics.jsonl lags the ranks by the supervisor's stalls, and a stop step a rank
        # already passed splits its group (one rank stops, its peer waits in a quorum).
        request_finish(str(run_dir), max(m["step"] for m in read_jsonl(metrics_path)) + 15)
        code = finish_job(proc, run_dir, 180)
    finally:
        if proc.poll() is None:
            # SIGTERM first: a SIGKILLed supervisor leaves its Monarch procs running.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, console(run_dir)[-3000:]

    events = read_jsonl(events_path)
    started = [e for e in events if e["event"] == "job_started"][0]
    assert started["launcher"] == "monarch"
    exited = [e for e in events if e["event"] == "rank_exited" and e["group"] == 1 and e.get("signal") == "SIGKILL"]
    assert exited and exited[0]["rank"] == 1
    assert any(e["event"] == "group_failed" and e["group"] == 1 for e in events)
    relaunch = [e for e in events if e["event"] == "rank_launched" and e["group"] == 1 and e["attempt"] == 1]
    assert {e["rank"] for e in relaunch} == {0, 1}, "group 1's mesh was respawned"
    assert not {e["pid"] for e in relaunch} & {e["pid"] for e in events if e["event"] == "rank_launched" and e["attempt"] == 0}
    healed = [e for e in events if e["event"] == "weights_recovered" and e["group"] == 1 and e["attempt"] == 1]
    assert {e["rank"] for e in healed} == {0, 1}, "both ranks of the new group heal from a peer"
    assert all(e["src_group"] == 0 and e["bytes"] > 0 for e in healed)
    # The second fault went through the standby: the promoted ranks are the standby mesh's
    # procs (none of group 1's meshes), healed from the peer.
    paths = {(e["group"], e["attempt"]): e["path"] for e in events if e["event"] == "recovery_path"}
    assert paths == {(1, 1): "cold_start", (1, 2): "standby"}, paths
    (promoted,) = [e for e in events if e["event"] == "standby_promoted"]
    assert promoted["standby"] == 0 and promoted["group"] == 1 and promoted["attempt"] == 2
    healed2 = {e["rank"]: e["pid"] for e in events if e["event"] == "weights_recovered" and e["group"] == 1 and e["attempt"] == 2}
    assert healed2 == dict(enumerate(standby_pids)), healed2
    assert not set(standby_pids) & {e["pid"] for e in events if e["event"] == "rank_launched"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["weights_consistent"] is True
    assert summary["groups"]["1"]["restarts"] == 2 and summary["groups"]["0"]["restarts"] == 0
    assert summary["status"] == "completed"
    assert summary["standby"]["promoted"] == 1 and summary["standby"]["launched"] >= 2, summary["standby"]
    assert_weights_agree_after(run_dir, 1, 2)
    # At each fault the failed group's procs were ended, the one whose train() raised included:
    # group 0's collectives with them failed on the closed connection, never by waiting out
    # ft.timeout_s on a proc left running (gloo's "Timed out waiting", seen before the fix).
    for r in (0, 1):
        log = (run_dir / "logs" / f"g0r{r}.a0.log").read_text()
        assert "Timed out waiting" not in log, [line for line in log.splitlines() if "Timed out waiting" in line]
    # No Monarch proc of this job is left, the standbys' included (their command lines do not name the run dir).
    wait_for(lambda: not (all_monarch_procs() - before), 60, "every Monarch proc of the job to exit")
