"""A real fork server (monarch_ft.rank.zygote, driven by monarch_ft.controller.fork_pool) with
real forked children, signals and exit codes."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time

import psutil
import pytest

from monarch_ft.common.process import die_with_parent
from monarch_ft.controller.fork_pool import EXIT_REPORT_WAIT_S, ForkError, ForkServer, ServerState
from monarch_ft.launcher.base import ForkHost, RankLaunch
from monarch_ft.common.cpu_priority import may_raise_priority

WORKER = [sys.executable, "-m", "monarch_ft.rank.worker"]


def _launch(tmp_path, name: str, spec: str) -> RankLaunch:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")
    return RankLaunch(group=0, rank=0, attempt=1, argv=[*WORKER, spec], env=env, log_path=str(tmp_path / "logs" / f"{name}.log"), cwd=str(tmp_path))


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_real_fork_server_forks_ranks_and_reports_their_exits(tmp_path):
    """A fork server with the worker's imports: forked children are ranks in their own
    session and log, signals and /proc reach them by pid, their exit codes come back through
    the server; once the server is gone a child is watched by pid and start time. Started
    while a job trains, it imports niced and takes priority 0 back before it forks a rank."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")
    host = ForkHost("localhost", [], die_with_parent)
    server = ForkServer(host, env, str(tmp_path / "logs" / "fs.log"), str(tmp_path), ["monarch_ft.rank.trainer"], niceness=10)
    forked = []  # killed at the end, whatever failed: two of them block on a FIFO, and outlive the server
    try:
        niced = 10 if may_raise_priority() else 0  # root here: CAP_SYS_NICE
        # Where it may take the foreground back (root), it imports niced and under SCHED_IDLE.
        background = lambda: psutil.Process(server.pid).nice() == niced and (not niced or os.sched_getscheduler(server.pid) == os.SCHED_IDLE)  # noqa: E731
        _wait(lambda: background() or server.state is ServerState.READY, 10, "the server's niceness and SCHED_IDLE")
        assert not niced or server.state is not ServerState.READY, "seen importing in the background"
        _wait(lambda: server.state is ServerState.READY, 120, "the fork server ready")
        assert server.ready_info["import_s"] > 0 and server.ready_info["import_niceness"] == niced, server.ready_info
        assert psutil.Process(server.pid).nice() == 0, "priority 0 back before any fork"
        assert {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{server.pid}/task")} == {os.SCHED_OTHER}, "every thread back at SCHED_OTHER"
        # A spec that is not there: the worker fails as `python -m monarch_ft.rank.worker` would (1).
        bad = server.fork(_launch(tmp_path, "bad", str(tmp_path / "missing.json")), die_with_parent=False)
        assert bad.wait(30) == 1
        assert "missing.json" in (tmp_path / "logs" / "bad.log").read_text()
        # A spec that is a FIFO nobody writes: the worker blocks opening it, a live rank.
        fifos = []
        for n in range(2):
            fifos.append(tmp_path / f"spec{n}.json")
            os.mkfifo(fifos[-1])
        a = server.fork(_launch(tmp_path, "a", str(fifos[0])), die_with_parent=False)
        forked.append(a)
        # b as a warm standby is forked: at the launch's niceness, under SCHED_IDLE, as the local launcher starts one.
        b = server.fork(dataclasses.replace(_launch(tmp_path, "b", str(fifos[1])), niceness=10), die_with_parent=False)
        forked.append(b)
        pa = psutil.Process(a.pid)
        assert pa.nice() == 0 and os.sched_getscheduler(a.pid) == os.SCHED_OTHER, "a forked rank trains at the ranks' priority"
        standby_niced = lambda: psutil.Process(b.pid).nice() == 10 and os.sched_getscheduler(b.pid) == os.SCHED_IDLE  # noqa: E731
        _wait(standby_niced, 10, "a forked standby at niceness 10 under SCHED_IDLE (it builds below the ranks)")
        # The server answers once it has forked; the child makes its session (and moves to its
        # cwd) a moment later, on a loaded machine later than the answer (CI: its sid still the server's).
        _wait(lambda: os.getsid(a.pid) == a.pid and pa.cwd() == str(tmp_path), 10, "the forked rank in a session of its own, in its cwd")
        assert pa.ppid() == server.pid
        # It reads as the rank it is (ps, psutil, a run's leak check), not as the server.
        assert pa.cmdline() == a.launch.argv, pa.cmdline()
        # Its kernel name too (top's column): the program's, not the server's title (monarch_ft.common.proctitle).
        assert psutil.Process(server.pid).name() == "mft:forkserver" and pa.name() == os.path.basename(a.launch.argv[0])[:15], pa.name()
        assert psutil.Process(server.pid).cmdline()[0] == f"monarch_ft[{tmp_path}] forkserver", psutil.Process(server.pid).cmdline()
        assert a.poll() is None
        a.send_signal(signal.SIGSTOP)
        _wait(lambda: pa.status() == psutil.STATUS_STOPPED, 10, "the rank stopped")
        a.kill()
        assert a.wait(10) == -signal.SIGKILL
        # Not a rank launch: refused, the relaunch would start cold.
        with pytest.raises(ForkError, match="not a rank launch"):
            server.fork(RankLaunch(0, 0, 1, ["nice", "true"], env, str(tmp_path / "x.log"), str(tmp_path)), die_with_parent=False)
        # The server dies: its live child is an orphan now, watched by pid and start time.
        os.kill(server.pid, signal.SIGKILL)
        _wait(lambda: server.state is ServerState.GONE, 10, "the server gone")
        assert b.poll() is None and psutil.Process(b.pid).is_running()
        with pytest.raises(ForkError):
            server.fork(_launch(tmp_path, "c", str(fifos[1])), die_with_parent=False)
        b.kill()
        assert b.wait(10) == 255  # gone without rank_finished: LOST_EXIT, as an adopted rank
    finally:
        for child in forked:
            child.send_signal(signal.SIGKILL)  # only while it runs (its pid is not another's by then)
        server.close()


@pytest.mark.slow
def test_ranks_that_died_together_are_seen_exited_in_one_pass_however_late_the_reader(tmp_path):
    """The replay of CI at 4d09a38: the controller, continued after a pause, read one forked
    rank's exit while the other's report still sat in the server's channel, took that group
    for a live peer and told the first group's standby to heal from it. A rank found gone
    is seen exited, with its code, by the poll that finds it so."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")
    server = ForkServer(ForkHost("localhost", [], die_with_parent), env, str(tmp_path / "logs" / "fs.log"), str(tmp_path), [])
    try:
        _wait(lambda: server.state is ServerState.READY, 30, "the fork server ready")
        ranks = [server.fork(_launch(tmp_path, f"r{n}", str(tmp_path / f"missing{n}.json")), die_with_parent=False) for n in range(2)]
        # The reader held back (the controller paused) while both ranks die and the server
        # reaps them and writes their reports; let go only once this thread polls.
        held, polling = threading.Event(), threading.Event()

        def hold_reader() -> None:
            with server._cond:
                held.set()
                _wait(lambda: not any(psutil.pid_exists(r.pid) for r in ranks), 30, "both ranks reaped by the server")
                polling.wait(30)
                time.sleep(0.05)

        holder = threading.Thread(target=hold_reader)
        holder.start()
        held.wait(30)
        _wait(lambda: not any(psutil.pid_exists(r.pid) for r in ranks), 30, "both ranks reaped by the server")
        polling.set()
        assert [r.poll() for r in ranks] == [1, 1], "both exits seen in one pass"
        holder.join()
        # A server that never reports (stopped) costs one bounded wait, then none.
        fifo = tmp_path / "blocks.json"
        os.mkfifo(fifo)  # nobody writes it: the rank blocks opening its spec, alive
        late = server.fork(_launch(tmp_path, "late", str(fifo)), die_with_parent=False)
        assert late.poll() is None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            os.kill(late.pid, signal.SIGKILL)
            _wait(lambda: psutil.Process(late.pid).status() == psutil.STATUS_ZOMBIE, 30, "the rank dead, unreaped")
            started = time.monotonic()
            assert late.poll() is None and late.poll() is None
            assert time.monotonic() - started < 2 * EXIT_REPORT_WAIT_S
        finally:
            os.kill(server.pid, signal.SIGCONT)
        _wait(lambda: late.poll() == -signal.SIGKILL, 30, "the late report read once the server goes on")
    finally:
        server.close()
