"""Warm fork, the pure parts: the relaunch path (monarch_ft.controller.fork_pool), the wire
format (records.fork_wire), what can be forked (records.launch), fork safety (rank.zygote).
A real fork server is in tests/jobs/test_fork_server_jobs.py; the whole path in a job (a
killed group with no standby back through warm_fork) in tests/jobs/test_standby_jobs.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from monarch_ft.controller.fork_pool import FIRST_LAUNCH_WAIT_S, ForkError, ServerState, WarmForks, first_launch_path, relaunch_path
from monarch_ft.launcher.base import ForkHost, Launcher, RankLaunch
from monarch_ft.launcher.local import LocalLauncher
from monarch_ft.common.cpu_priority import may_raise_priority
from monarch_ft.rank.zygote import fork_unsafe, import_niceness
from monarch_ft.records.events import RecoveryPath
from monarch_ft.records.fork_wire import ForkOp, ProtocolError, decode, encode
from monarch_ft.records.launch import worker_spec

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


def test_a_first_launch_waits_for_its_hosts_server_then_forks_and_never_waits_for_nothing():
    ready, starting = ServerState.READY, ServerState.STARTING
    assert first_launch_path("live", True, None, ready, False, 0.0) == (RecoveryPath.WARM_FORK, None)
    # Importing, or not started yet (the loop starts it after its first launches): wait.
    for server in (starting, None, ServerState.GONE):
        assert first_launch_path("live", True, None, server, False, 1.0) is None
    # No server will come: cold at once, and why.
    assert first_launch_path("live", False, None, None, False, 0.0) == (RecoveryPath.COLD_START, "ft.warm_fork=false")
    path, why = first_launch_path("full_restart", True, None, None, False, 0.0)
    assert path is RecoveryPath.COLD_START and "full_restart" in why
    path, why = first_launch_path("live", True, "launcher=slurm starts ranks through its engine", None, False, 0.0)
    assert path is RecoveryPath.COLD_START and "slurm" in why
    path, why = first_launch_path("live", True, None, None, True, 0.0)
    assert path is RecoveryPath.COLD_START and "died 3 times" in why
    # A server stuck importing holds the start up for FIRST_LAUNCH_WAIT_S at most.
    path, why = first_launch_path("live", True, None, starting, False, FIRST_LAUNCH_WAIT_S)
    assert path is RecoveryPath.COLD_START and why == f"the fork server on its host was still importing after {FIRST_LAUNCH_WAIT_S:.0f} s"


def test_protocol_round_trip_and_bad_lines():
    line = encode(ForkOp.FORK, id=3, argv=[*WORKER, "s.json"], env={"A": "1"}, cwd="/", log_path="/x.log", die_with_parent=False, niceness=0)
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


def test_a_server_imports_niced_only_where_it_may_take_priority_0_back(tmp_path):
    assert import_niceness("10", may_raise=True) == 10
    # Without CAP_SYS_NICE its forks would train niced: it imports at 0.
    assert import_niceness("10", may_raise=False) == 0
    assert import_niceness(None, True) == 0 and import_niceness("x", True) == 0 and import_niceness("-5", True) == 0
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t000001ffffffffff\n")  # root: every capability
    assert may_raise_priority(str(status))
    status.write_text("Name:\tpython\nCapEff:\t0000000000000000\n")
    assert not may_raise_priority(str(status))
    assert not may_raise_priority(str(tmp_path / "missing"))


class _Hosts(Launcher):
    """Simulated hosts h0, h1, ... on one machine (ForkHost.netns set), or one real host."""

    name = "hosts"

    def __init__(self, simulated: bool = True) -> None:
        super().__init__()
        self.simulated = simulated

    def launch_group(self, ranks):
        raise NotImplementedError

    def fork_host(self, group):
        key = f"h{group}"
        return ForkHost(key, [], None, {"HOST_ENV": key}, key, key if self.simulated else None)


class _Server:
    """A fork server that records its forks (state as the test sets it)."""

    def __init__(self, host, env, log_path, cwd, preload, niceness=0) -> None:
        self.host, self.state, self.forks = host, ServerState.READY, []

    def alive(self) -> bool:
        return self.state is not ServerState.GONE

    def fork(self, launch, die_with_parent, report_path="", netns=None):
        self.forks.append((launch, netns))
        return SimpleNamespace(launch=launch)


def _pool(tmp_path, simulated=True) -> WarmForks:
    return WarmForks(True, _Hosts(simulated), lambda key, n: str(tmp_path / f"{key}.{n}.log"), dict, str(tmp_path), server=_Server)


def _launch(group: int) -> RankLaunch:
    return RankLaunch(group=group, rank=0, attempt=0, argv=WORKER, env={}, log_path="/dev/null", cwd="/")


def test_a_standby_on_a_new_simulated_host_is_forked_by_another_hosts_server_and_enters_its_own(tmp_path):
    pool = _pool(tmp_path)
    pool.start_server(0, 0)
    pool.start_server(1, 0)
    # Host 2 (a standby's) has no server: only a fork that may use another host's can be asked.
    assert not pool.can_fork(2) and pool.can_fork(2, any_host=True)
    with pytest.raises(ForkError):
        pool.launch_group([_launch(2)])
    (proc,) = pool.launch_group([_launch(2)], any_host=True)
    # The first ready server by host key forks it; the child enters host 2 (netns), with host 2's env and name.
    ((launch, netns),) = pool.servers["h0"].forks
    assert netns == "h2" and launch.env["HOST_ENV"] == "h2" and proc.launch.host == "h2"
    # A host's own ready server forks for it, with nothing to enter.
    pool.launch_group([_launch(1)], any_host=True)
    assert pool.servers["h1"].forks[0][1] is None
    # Its own server still importing: another ready one forks instead; none ready: none can.
    pool.servers["h1"].state = ServerState.STARTING
    pool.launch_group([_launch(1)], any_host=True)
    assert pool.servers["h0"].forks[-1][1] == "h1"
    pool.servers["h0"].state = ServerState.GONE
    assert not pool.can_fork(1, any_host=True) and not pool.can_fork(2, any_host=True)


def test_a_real_hosts_server_forks_only_for_its_own_host(tmp_path):
    pool = _pool(tmp_path, simulated=False)
    pool.start_server(0, 0)
    # No namespace to enter: another machine's process cannot be forked here.
    assert pool.can_fork(0) and not pool.can_fork(2, any_host=True)
    with pytest.raises(ForkError):
        pool.launch_group([_launch(2)], any_host=True)
