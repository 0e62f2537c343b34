"""Simulated hosts (a network namespace per replica group) and network faults, for real:
real namespaces, veths and a bridge, real rank processes under ``ip netns exec``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.jobs import FAST, NO_STANDBY, console, finish_job, need_netns, netns_left_behind, read_jsonl, run_drill_job, start_job, wait_for

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, socket, sys, time
    v = ctypes.c_int(-1)
    ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(v))  # PR_GET_PDEATHSIG
    host, bridge, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = socket.socket(); s.bind((host, 0)); s.listen()
    out = {"pid": os.getpid(), "pdeathsig": v.value, "bound": s.getsockname()[0],
           "hostname": socket.gethostname(), "resolves_to": socket.gethostbyname(socket.gethostname())}
    try:
        socket.create_connection((bridge, port), 2).close(); out["bridge"] = "ok"
    except OSError as e:
        out["bridge"] = repr(e)
    print(json.dumps(out), flush=True)
    time.sleep(120)
    """
)


def _connects(netns: str, address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a fresh TCP connection from inside ``netns`` to ``address:port`` succeeds within ``timeout``."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), {timeout}).close()"
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, timeout=20).returncode == 0


@pytest.mark.slow
def test_launcher_makes_hosts_ranks_bind_them_and_close_removes_everything(tmp_path):
    need_netns()
    from monarch_ft.launcher.base import RankLaunch
    from monarch_ft.launcher.local import LocalLauncher

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    launcher = LocalLauncher(simulated_hosts=True)
    run_id = launcher.hosts.id
    procs = []
    second = None
    try:
        bridge = launcher.control_host()
        assert bridge.startswith("10.213.") and bridge.endswith(".1")
        server = socket.socket()
        server.bind((bridge, 0))
        server.listen(8)
        port = server.getsockname()[1]
        for g in (0, 1):
            addr = launcher.group_host(g)
            argv = [sys.executable, str(probe), addr, bridge, str(port)]
            procs += launcher.launch_group([RankLaunch(g, 0, 0, argv, dict(os.environ), str(tmp_path / f"g{g}.log"), str(tmp_path))])
        desc = launcher.describe()
        assert desc["launcher"] == "local"
        assert {g: h["netns"] for g, h in desc["hosts"].items()} == {0: f"mft{run_id}-h0", 1: f"mft{run_id}-h1"}
        addrs = [desc["hosts"][g]["address"] for g in (0, 1)]
        assert len(set(addrs)) == 2 and all(a.rsplit(".", 1)[0] == bridge.rsplit(".", 1)[0] for a in addrs)

        def report(p):
            text = open(p.launch.log_path).read().strip()
            return json.loads(text) if text else None

        deadline = time.time() + 30
        while time.time() < deadline and not all(report(p) for p in procs):
            time.sleep(0.1)
        for g, p in enumerate(procs):
            rep = report(p)
            assert rep, open(p.launch.log_path).read()
            # The pid held is the rank's python itself (ip execs it): signals reach it.
            # Not tied to the controller's life (the job outlives it: monarch_ft.controller).
            assert rep["pid"] == p.pid and rep["pdeathsig"] == 0, rep
            assert rep["bound"] == addrs[g] and rep["bridge"] == "ok", rep
            assert rep["hostname"] == f"mft{run_id}-h{g}" and rep["resolves_to"] == addrs[g], rep
            assert p.launch.host == f"mft{run_id}-h{g}"
        # Loopback is up inside the namespace; nothing routes off the subnet.
        ns = desc["hosts"][0]["netns"]
        up = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "lo"], capture_output=True, text=True).stdout
        assert "UP" in up
        routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True).stdout
        assert "default" not in routes, routes

        # A partition cuts the host off the bridge, then it comes back.
        def reach(g):
            return _connects(desc["hosts"][g]["netns"], bridge, port)

        restored = []
        launcher.partition(1, 2.0, on_restore=restored.append)
        assert not reach(1) and reach(0)
        deadline = time.time() + 10
        while not restored and time.time() < deadline:
            time.sleep(0.1)
        assert restored and restored[0]["kind"] == "partition" and reach(1)

        from monarch_ft.launcher.hosts import qdisc_supported

        if qdisc_supported("tbf"):
            launcher.slow_link(1, rate="1mbit", seconds=30)
            veth = launcher.hosts.hosts[1].veth
            assert "tbf" in subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True, text=True).stdout
            launcher.restore_link(1)
            assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True, text=True).stdout
        else:
            print("SKIP part: tc tbf not available, slow_link not exercised")
        # The controller gone (its hosts' state names a dead process): the hosts stay while
        # ranks run in them, and a new controller's launcher adopts them, ranks and all.
        from monarch_ft.common.process import ProcessIdentity
        from monarch_ft.launcher.hosts import cleanup_stale

        state_path = f"/run/monarch_ft/hosts/{run_id}.json"
        state = json.load(open(state_path))
        json.dump({**state, "start_time": "0"}, open(state_path, "w"))
        assert run_id not in cleanup_stale()
        second = LocalLauncher(simulated_hosts=True)
        fresh = second.hosts.id
        second.restore_handles(launcher.handles())
        assert second.hosts.id == run_id and second.describe()["hosts"] == desc["hosts"] and netns_left_behind(fresh) == []
        assert json.load(open(state_path))["pid"] == os.getpid()
        adopted = [second.adopt(p.launch, ProcessIdentity.of(p.pid), str(tmp_path / "no-report")) for p in procs]
        assert [a.poll() for a in adopted] == [None, None] and reach(0) and reach(1)
        # SIGTERM from the supervisor's side reaches the rank.
        for p in procs:
            p.send_signal(15)
            assert p.wait(10) == -15
        server.close()
    finally:
        for p in procs:
            p.kill()
        launcher.close()
        if second is not None:
            second.close()
    assert netns_left_behind(run_id) == []


@pytest.mark.slow
def test_pretrain_2x2_on_simulated_hosts_detached_and_attached(run_dir):
    """A real job on simulated hosts; its controller detaches (SIGUSR2) mid-run and a new one
    adopts the hosts (namespaces, bridge) and the ranks in them, and finishes the job."""
    need_netns()
    overrides = [*FAST, "ft.replica_groups=2", "ft.ranks_per_group=2", "training.steps=40", "launcher=local_hosts"]
    first = start_job(run_dir, *overrides)
    wait_for(lambda: len({m["group"] for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("committed")}) == 2, 150, "both groups committing")
    first.send_signal(signal.SIGUSR2)
    assert first.wait(30) == 0, console(run_dir)[-3000:]
    ranks = [r["pid"] for g in RunLayout(str(run_dir)).read_controller_state()["groups"] for r in g["ranks"]]
    assert all(psutil.pid_exists(p) for p in ranks), "the ranks outlive a detached controller"
    code = finish_job(start_job(run_dir, *overrides, "controller.attach=true"), run_dir, 180)
    assert code == 0, console(run_dir)[-3000:]
    attached = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "controller_attached"]
    assert len(attached) == 1 and attached[0]["groups"] == {"0": "adopt", "1": "adopt"}, attached
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 0 and summary["job_step"] == 40 and summary["controller"]["controllers"] == 2, summary
    assert summary["status"] == "completed" and summary["weights_consistent"] is True
    hosts = summary["hosts"]
    # A host per group, and one for the warm standby (on by default), each its own address.
    assert {"0", "1"} <= set(hosts) <= {"0", "1", "2"} and len({h["address"] for h in hosts.values()}) == len(hosts), hosts
    bridge = summary["bridge"]["address"]
    assert summary["lighthouse"].startswith(f"http://{bridge}:")
    events = read_jsonl(run_dir / "events.jsonl")
    launched = [e for e in events if e["event"] == "rank_launched"]
    assert {(e["group"], e["host"]) for e in launched} == {(0, hosts["0"]["netns"]), (1, hosts["1"]["netns"])}
    # The ranks advertised their host (the Manager's quorum addresses are in their logs).
    log = (run_dir / "logs" / "g1r0.a0.log").read_text(errors="replace")
    assert f'store_address: "{hosts["0"]["address"]}:' in log, log[-2000:]
    run_id = hosts["0"]["netns"][3:].split("-")[0]
    assert netns_left_behind(run_id) == []


@pytest.mark.slow
def test_partition_drill_drops_the_group_and_it_heals_in_place(run_dir):
    """A partition longer than ft.timeout_s but shorter than the hang timeout: the group is
    dropped from the quorum, then rejoins and heals from a peer without a restart."""
    need_netns()
    drill = run_drill_job(
        run_dir,
        "launcher=local_hosts",
        "chaos.faults=[{kind: partition, duration_s: 6, at_step: 10, target: 1}]",
        "ft.timeout_s=3",
        "ft.hang_timeout_s=12",
        "chaos.recovery_timeout_s=20",
        "chaos.tail_steps=5",
        # It heals in place: no relaunch for a standby to serve, and the fault would wait for one to be built.
        NO_STANDBY,
        timeout=200,
    )
    (fault,) = drill["faults"]
    assert fault["kind"] == "partition" and fault["recovered"] and fault["weights_consistent"] is True, fault
    ph = fault["phases"]
    # Dropped once the survivors' allreduce timed out (ft.timeout_s=3): group 0 committed alone;
    # group 1 back only after the link was (the partition's 6 s).
    assert ph["detected"] is not None and ph["survivors_stepping"] is not None and ph["back_in_quorum"] >= 6.0, ph
    assert drill["weights_consistent"] and drill["steps_never_go_back"]
    events = read_jsonl(run_dir / "events.jsonl")
    assert [e for e in events if e["event"] == "link_restored" and e["group"] == 1]
    assert any(m["group"] == 0 and m["committed"] and m["participating_groups"] == [0] for m in read_jsonl(run_dir / "metrics.jsonl"))
    # Healed in place, as the docstring says: no restart (the partition is shorter than the
    # hang timeout, and a rank waiting in TorchFT is within its budget), weights from group 0.
    assert not [e for e in events if e["event"] in ("group_failed", "group_launched") and e["group"] == 1 and e.get("attempt", 0) > 0]
    assert not any(e["event"] == "group_failed" for e in events), [e for e in events if e["event"] == "group_failed"]
    assert ph["weights_recovered"] is not None and fault["recovered_from_group"] == 0, fault
