"""Simulated hosts (a network namespace per replica group), quickly: the bridge address stays
reachable while hosts are added, and impossible network faults are refused before launch.
Jobs on them are in tests/jobs/test_simulated_hosts_jobs.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from monarch_ft.testing.jobs import assert_drill_refused, need_netns, netns_left_behind

ECHO = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while (b := c.recv(1)):
            c.sendall(b)
    except ConnectionResetError:  # the client stopped with a reply in flight
        pass
    """
)

# One byte out, one back, as fast as they go, until a line arrives on stdin; the longest wait
# for a reply (the one still outstanding at the stop included) is the longest gap.
PING_PONG = textwrap.dedent(
    """
    import json, select, socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print("connected", flush=True)
    worst, replies, last, waiting = 0.0, 0, time.monotonic(), False
    while True:
        if not waiting:
            s.sendall(b"x"); waiting = True
        ready = select.select([s, sys.stdin], [], [], 60)[0]
        if s in ready:
            assert s.recv(1) == b"x", "the echo server went away"
            now = time.monotonic(); worst = max(worst, now - last); last, waiting, replies = now, False, replies + 1
        else:
            break
    print(json.dumps({"worst_gap_s": max(worst, time.monotonic() - last), "replies": replies}), flush=True)
    """
)


def _mac(dev: str) -> str:
    return open(f"/sys/class/net/{dev}/address").read().strip()


def _connects(netns: str, address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a fresh TCP connection from inside ``netns`` to ``address:port`` succeeds within ``timeout``."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), {timeout}).close()"
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, timeout=20).returncode == 0


def test_hosts_added_while_hosts_talk_to_the_bridge_address_never_cut_them_off():
    """The Lighthouse listens on the bridge address; hosts join the bridge while a job runs
    (standbys, relaunches on a fresh host), and a new controller adopts the bridge and adds
    more. None of it may cut a host off the bridge address: host 0 keeps a TCP connection to
    it busy (ping-pong), host 1 has talked to it and connects again afterwards, while six hosts
    join, one with a lower MAC than every other port, and an adopting controller adds one
    more. (A bridge that follows its ports takes that MAC; the hosts' neighbour entries then
    name one it drops frames to: measured 0.4 s for the busy connection, 30-55 s for host 1.)"""
    need_netns()
    from monarch_ft.launcher.hosts import SimulatedHosts

    hosts = SimulatedHosts()
    adopted = None
    procs: list[subprocess.Popen] = []
    listener = socket.socket()
    try:
        h0, h1 = hosts.host(0), hosts.host(1)
        listener.bind((hosts.bridge_address, 0))
        listener.listen(8)
        fresh_port = listener.getsockname()[1]
        assert _connects(h1.netns, hosts.bridge_address, fresh_port)
        server = subprocess.Popen([sys.executable, "-c", ECHO, hosts.bridge_address], stdout=subprocess.PIPE, text=True)
        procs.append(server)
        port = server.stdout.readline().strip()
        argv = ["ip", "netns", "exec", h0.netns, sys.executable, "-c", PING_PONG, hosts.bridge_address, port]
        client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(client)
        assert client.stdout.readline().strip() == "connected"
        mac = _mac(hosts.bridge)
        time.sleep(0.2)
        for g in range(2, 7):
            hosts.host(g)
        subprocess.run(["ip", "link", "set", "dev", hosts.hosts[6].veth, "address", "02:00:00:00:00:01"], check=True)
        adopted = SimulatedHosts.adopt(hosts.id)
        assert adopted is not None and adopted.bridge == hosts.bridge
        adopted.host(7)
        time.sleep(0.3)
        reconnected = _connects(h1.netns, hosts.bridge_address, fresh_port)
        client.stdin.write("stop\n")
        client.stdin.flush()
        report = json.loads(client.stdout.readline())
        assert client.wait(10) == 0
        print(f"ping-pong to the bridge address while 6 hosts joined: {report}")
        assert report["replies"] > 20 and report["worst_gap_s"] < 0.1, report
        assert reconnected, "host 1 cannot reach the bridge address after hosts joined"
        assert _mac(hosts.bridge) == mac == hosts.bridge_mac, "the bridge took another address"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        listener.close()
        if adopted is not None:
            adopted.close()
        hosts.close()
    assert netns_left_behind(hosts.id) == []


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["chaos.faults=[{kind: partition, at_step: 5, duration_s: 3}]"], "use launcher=local_hosts"),
        (["launcher=local_hosts", "chaos.faults=[{kind: slow_link, at_step: 5}]"], "needs delay_ms > 0 and/or a rate"),
    ],
)
def test_network_faults_fail_before_launch_when_impossible(tmp_path, overrides, expected):
    assert_drill_refused(tmp_path, overrides, expected)


def test_link_delay_refused_exactly_where_the_kernel_lacks_netem(tmp_path):
    """A delay needs netem: refused with the fix named where the kernel lacks it (this
    machine's), accepted where it has it; either way something is asserted."""
    need_netns()
    from chaos.config import DrillConfig, FaultConfig, validate_chaos
    from monarch_ft.config.launcher import LauncherConfig
    from monarch_ft.launcher.hosts import qdisc_supported
    from monarch_ft.records.errors import ConfigError

    fault = FaultConfig(kind="slow_link", at_step=5, delay_ms=50)
    cfg = DrillConfig(launcher=LauncherConfig(name="local", options={"simulated_hosts": True}))
    if qdisc_supported("netem"):
        validate_chaos(cfg, [fault])
    else:
        with pytest.raises(ConfigError, match="no tc netem qdisc"):
            validate_chaos(cfg, [fault])
        assert_drill_refused(tmp_path, ["launcher=local_hosts", "chaos.faults=[{kind: slow_link, at_step: 5, delay_ms: 50}]"], "netem")
