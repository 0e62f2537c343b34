"""Warm fork (monarch_ft.controller.fork_pool): the pure parts (path decision, protocol, fork safety)
fast; a real fork server with real forked children, signals and exit codes in one short
slow test. The whole path in a job (a killed group with no standby back through warm_fork,
in quorum, weights consistent) is in tests/test_standby_jobs.py."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from monarch_ft.records.events import RecoveryPath
from monarch_ft.controller.fork_pool import ForkError, ForkServer, ServerState, relaunch_path
from monarch_ft.rank.zygote import fork_unsafe
from monarch_ft.records.fork_wire import ForkOp, ProtocolError, decode, encode
from monarch_ft.records.launch import worker_spec
from monarch_ft.launcher.base import ForkHost, Launcher, RankLaunch
from monarch_ft.launcher.local import LocalLauncher
from monarch_ft.common.process import die_with_parent

WORKER = [sys.executable, "-m", "monarch_ft.rank.worker"]


def test_relaunch_path_warm_only_when_asked_possible_and_ready():
    ready = ServerState.READY
    assert relaunch_path("live", True, None, ready) == (RecoveryPath.WARM_FORK, None)
    # The baseline keeps its meaning: every rank cold, whatever else is set.
    path, why = relaunch_path("full_restart", True, None, ready)
    assert path is RecoveryPath.COLD_START and "full_restart" in why
    path, why = relaunch_path("live", False, None, ready)
    assert path is RecoveryPath.COLD_START and why == "ft.warm_fork=false"
    path, why = relaunch_path("live", True, "launcher=slurm starts ranks through its engine", None)
    assert path is RecoveryPath.COLD_START and "slurm" in why
    path, why = relaunch_path("live", True, None, ServerState.STARTING)
    assert path is RecoveryPath.COLD_START and "importing" in why
    for gone in (ServerState.GONE, None):
        path, why = relaunch_path("live", True, None, gone)
        assert path is RecoveryPath.COLD_START and "no fork server" in why


def test_protocol_round_trip_and_bad_lines():
    line = encode(ForkOp.FORK, id=3, argv=[*WORKER, "s.json"], env={"A": "1"}, cwd="/", log_path="/x.log", die_with_parent=False)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    msg = decode(line)
    assert msg["op"] is ForkOp.FORK and msg["id"] == 3 and msg["env"] == {"A": "1"}
    assert decode(encode(ForkOp.EXITED, id=3, pid=10, code=-9))["code"] == -9
    for bad, what in (
        (b"not json", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"op": "launch"}', "unknown op"),
        (b'{"op": "forked", "id": 1}', "forked without pid"),
        (b"\xff\xfe", "not JSON"),
    ):
        with pytest.raises(ProtocolError, match=what):
            decode(bad)


def test_only_a_plain_rank_launch_is_forked():
    assert worker_spec([*WORKER, "/r/g0r0.a1.spec.json"]) == "/r/g0r0.a1.spec.json"
    assert worker_spec(["nice", "-n", "10", *WORKER, "s.json"]) is None  # a standby's launch
    assert worker_spec([sys.executable, "-m", "monarch_ft.other", "s.json"]) is None
    assert worker_spec([*WORKER]) is None


def test_fork_refused_with_other_threads_or_cuda():
    assert fork_unsafe([], False) is None
    assert fork_unsafe(["jemalloc_bg_thd"], False) is None  # re-initialised by jemalloc's atfork handlers
    assert "gloo" in fork_unsafe(["jemalloc_bg_thd", "gloo"], False)
    assert "CUDA" in fork_unsafe([], True)


def test_which_launchers_fork():
    local = LocalLauncher()
    host = local.fork_host(0)
    assert host is not None and host.key == "localhost" and host.argv_prefix == []
    assert local.fork_host(1).key == host.key  # one fork server for every group on this machine

    class Engine(Launcher):
        name = "engine"

        def launch_group(self, ranks):
            raise NotImplementedError

    assert Engine().fork_host(0) is None


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
    the server; once the server is gone a child is watched by pid and start time."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")
    server = ForkServer(ForkHost("localhost", [], die_with_parent), env, str(tmp_path / "logs" / "fs.log"), str(tmp_path), ["monarch_ft.rank.trainer"])
    try:
        _wait(lambda: server.state is ServerState.READY, 120, "the fork server ready")
        assert server.ready_info["import_s"] > 0
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
        b = server.fork(_launch(tmp_path, "b", str(fifos[1])), die_with_parent=False)
        pa = psutil.Process(a.pid)
        assert pa.ppid() == server.pid and os.getsid(a.pid) == a.pid and pa.cwd() == str(tmp_path)
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
        server.close()
