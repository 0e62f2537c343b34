"""Warm standby groups in a real job: real processes, signals, a real Lighthouse, simulated hosts.

One job (launcher=local_hosts: a network namespace per group and per standby) covers, in a
row: a standby killed while waiting is rebuilt and never promoted; a node fault (every rank
of a group killed, its scratch and checkpoint files deleted) is recovered by the rebuilt
standby, which lives on a host of its own, back in quorum with bit-identical weights; a
second fault right after, while the next standby is still being built, takes the warm fork
path (no standby ready: its ranks forked from the fork server on its host, which imported
everything at launch; monarch_ft.controller.fork_pool), back in quorum with the same weights.
Every standby is forked too, by a server of another host (its own host is new and has none),
and enters its own host before it becomes a rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import psutil
import pytest

from monarch_ft.controller.loop import request_finish
from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.jobs import FAST, console, finish_job, need_netns, read_jsonl, start_job, wait_for

pytestmark = pytest.mark.slow


def _events(run_dir, kind, **match):
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]


def _pid(run_dir, group, rank, attempt):
    (e,) = _events(run_dir, "rank_launched", group=group, rank=rank, attempt=attempt)
    return e["pid"]


def _ps(pid) -> str:
    """What ps shows of a process: its kernel name (top's column) and its command line (monarch_ft.common.proctitle)."""
    return " ".join(subprocess.run(["ps", "-ww", "-o", "comm=", "-o", "args=", "-p", str(pid)], capture_output=True, text=True).stdout.split())


@pytest.mark.long
def test_standby_replaces_a_failed_node_a_dead_standby_is_rebuilt_and_a_second_fault_goes_cold(run_dir):
    need_netns()
    proc = start_job(
        run_dir,
        *FAST,
        "ft.standby_groups=1",
        "ft.warm_fork=true",
        "launcher=local_hosts",
        "ft.replica_groups=2",
        "ft.ranks_per_group=2",
        "training.steps=100000",
        "training.state_hash_every=1",
        "ft.restart_backoff_s=0.2",
    )
    try:
        # 1. The standby is built after the groups are up; killed while waiting, it is lost,
        #    rebuilt, and never promoted.
        (ready0,) = wait_for(lambda: _events(run_dir, "standby_ready", standby=0), 240, "standby 0 ready")
        (launched0,) = _events(run_dir, "standby_launched", standby=0)
        assert launched0["time"] > _events(run_dir, "training_started")[0]["time"]
        os.kill(launched0["pids"][1], signal.SIGKILL)
        wait_for(lambda: _events(run_dir, "standby_lost", standby=0), 30, "standby 0 lost")
        wait_for(lambda: _events(run_dir, "standby_ready", standby=1), 240, "standby 1 ready")
        (launched1,) = _events(run_dir, "standby_launched", standby=1)
        # Forked, not built cold beside the training ranks: its host (slot 3) has no fork server,
        # so a ready server of another host forked it, and it entered its own host (network
        # namespace and host name) before it became a rank.
        servers = {e["pid"]: e["host"] for e in _events(run_dir, "fork_server_ready")}
        own_host = _events(run_dir, "rank_launched", group=0, rank=0, attempt=0)[0]["host"].rsplit("-h", 1)[0] + "-h3"
        assert launched1["forked"] is True and own_host not in servers.values(), (launched1, servers)
        for pid in launched1["pids"]:
            assert psutil.Process(pid).ppid() in servers, (pid, servers)
            netns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()
            hostname = subprocess.run(["nsenter", "-t", str(pid), "-u", "hostname"], capture_output=True, text=True).stdout.strip()
            assert netns == own_host and hostname == own_host, (pid, netns, hostname)
        # Every process says what it is, with its run: ps shows the group and rank, not a spec path.
        a_server = wait_for(lambda: _events(run_dir, "fork_server_ready"), 60, "a fork server ready")[0]
        lighthouse = RunLayout(str(run_dir)).read_controller_state()["lighthouse"]
        assert _ps(proc.pid) == f"mft:controller monarch_ft[{run_dir}] controller"
        assert _ps(lighthouse["guard_pid"]) == f"mft:lh_guard monarch_ft[{run_dir}] lighthouse_guard"
        assert _ps(a_server["pid"]) == f"mft:forkserver monarch_ft[{run_dir}] forkserver"
        assert _ps(_pid(run_dir, 1, 0, 0)) == f"mft:g1r0.a0 monarch_ft[{run_dir}] g1r0 a0"
        assert [_ps(pid) for pid in launched1["pids"]] == [f"mft:sb1r{r} monarch_ft[{run_dir}] standby 1 r{r}" for r in (0, 1)]
        # 2. A node fault on group 1 (its ranks and its host's files): the rebuilt standby,
        #    on a host of its own, takes its place.
        for r in (0, 1):
            os.kill(_pid(run_dir, 1, r, 0), signal.SIGKILL)
        for d in ("scratch/group_1", "checkpoint/group_1"):
            shutil.rmtree(run_dir / d, ignore_errors=True)
        (promoted,) = wait_for(lambda: _events(run_dir, "standby_promoted", group=1), 30, "a promotion")
        assert promoted["standby"] == 1 and promoted["attempt"] == 1
        wait_for(lambda: _events(run_dir, "group_stepping", group=1, attempt=1), 60, "group 1 stepping again")
        # The promoted standby's processes say what they became.
        assert [_ps(pid) for pid in launched1["pids"]] == [f"mft:g1r{r}.a1 monarch_ft[{run_dir}] g1r{r} a1" for r in (0, 1)]
        # 3. A second fault while standby 2 is being built: no standby ready, so the ranks are
        #    forked from the fork server on group 0's host (the warm fork path). A forked standby
        #    builds in about 2 s, so it is held (SIGSTOP) until the fault is recovered: "still
        #    being built" by construction, not by a race with its build.
        (launched2,) = wait_for(lambda: _events(run_dir, "standby_launched", standby=2), 60, "standby 2 launched")
        for pid in launched2["pids"]:
            os.kill(pid, signal.SIGSTOP)
        assert not _events(run_dir, "standby_ready", standby=2)
        os.kill(_pid(run_dir, 0, 0, 0), signal.SIGKILL)
        wait_for(lambda: _events(run_dir, "group_stepping", group=0, attempt=1), 240, "group 0 back (warm fork)")
        for pid in launched2["pids"]:
            os.kill(pid, signal.SIGCONT)
        host0 = _events(run_dir, "rank_launched", group=0, rank=0, attempt=0)[0]["host"]
        (server,) = _events(run_dir, "fork_server_ready", host=host0)
        for r in (0, 1):
            forked = _events(run_dir, "rank_launched", group=0, rank=r, attempt=1)[0]
            # The server's children, in the group's own host (network namespace), in sessions of their own.
            assert forked["host"] == host0 and psutil.Process(forked["pid"]).ppid() == server["pid"], (forked, server)
            netns = subprocess.run(["ip", "netns", "identify", str(forked["pid"])], capture_output=True, text=True).stdout.strip()
            assert netns == host0 and os.getsid(forked["pid"]) == forked["pid"], netns
            assert _ps(forked["pid"]) == f"mft:g0r{r}.a1 monarch_ft[{run_dir}] g0r{r} a1"
        wait_for(lambda: [m for m in read_jsonl(run_dir / "metrics.jsonl") if m["group"] == 0 and m["attempt"] == 1 and m["committed"]], 60, "a commit")
        step = max(m["step"] for m in read_jsonl(run_dir / "metrics.jsonl"))
        request_finish(str(run_dir), step + 5)
        code = finish_job(proc, run_dir, timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert code == 0, console(run_dir)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["weights_consistent"] is True, summary
    sb = summary["standby"]
    assert sb["promoted"] == 1 and sb["lost"] == 1 and sb["launched"] >= 3 and sb["seconds_without_ready_standby"] > 0, sb
    # One recovery_path per relaunch, naming the path.
    paths = {(e["group"], e["attempt"]): e["path"] for e in _events(run_dir, "recovery_path")}
    assert paths == {(1, 1): "standby", (0, 1): "warm_fork"}, paths
    # The forked ranks' exit codes came back through their fork server (not the supervisor's children).
    assert sorted((e["rank"], e["exit_code"]) for e in _events(run_dir, "rank_exited", group=0, attempt=1)) == [(0, 0), (1, 0)]
    assert not _events(run_dir, "standby_promoted", standby=0), "a dead standby was promoted"
    # The promoted ranks are the standby's processes, healed from the peer.
    assert {e["rank"]: e["pid"] for e in _events(run_dir, "weights_recovered", group=1, attempt=1)} == {
        r: pid for r, pid in enumerate(_events(run_dir, "standby_launched", standby=1)[0]["pids"])
    }
    # The standbys ran on hosts of their own (slots 2, 3, 4); the promoted ranks, now group 1,
    # advertised their host's address (slot 3) to their peers.
    hosts = summary["hosts"]
    assert {"2", "3"} <= set(hosts) and hosts["3"]["address"] not in (hosts["0"]["address"], hosts["1"]["address"])
    assert hosts["3"]["address"] in (run_dir / "logs" / "sb1r0.log").read_text(errors="replace")
    # Bit-identical weights: every rank of both groups hashed the same state at every step
    # both committed in one quorum after the promoted group was back. (Not across quorums: a
    # group that commits a step alone and is killed before its healed peer joins it leaves
    # that peer to train the step again from the step before, in a quorum of its own; the
    # job's step never goes back, but the dead group's commit of that step is gone with it.)
    metrics = [m for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("state_hash")]
    back = min(m["step"] for m in metrics if m["group"] == 1 and m["attempt"] == 1)
    by_step: dict = {}
    for m in metrics:
        if m["step"] >= back:
            by_step.setdefault((m["step"], m["rank"], m["quorum_id"]), {})[m["group"]] = m["state_hash"]
    shared = [h for h in by_step.values() if len(h) == 2]
    assert shared and all(h[0] == h[1] for h in shared), shared[:3]
