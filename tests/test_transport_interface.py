"""The address a rank's checkpoint transport binds and advertises (ft.transport_interface):
the rule as a pure function, then for real inside a simulated host (a network namespace
with its own interfaces), and a bad value refused with one line before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch

from conftest import PRETRAIN, REPO
from monarch_ft.transport import ShardedTransport
from monarch_ft.transport.interface import InterfaceError, choose, local_interfaces, route_to
from monarch_ft.transport.rdma_discovery import RdmaPort

HOST = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.5", "fe80::1"], "ib0": ["192.168.7.5"], "down0": ["fe80::2"]}


def test_configured_name_or_address_wins():
    c = choose("ib0", HOST, RdmaPort("mlx5_0", 1, "InfiniBand", netdev="ib0"), "10.0.0.5")
    assert (c.address, c.interface, c.bind) == ("192.168.7.5", "ib0", "192.168.7.5") and "configured" in c.why
    c = choose("10.0.0.5", HOST, RdmaPort("mlx5_0", 1, "InfiniBand", netdev="ib0"), "10.0.0.5")
    assert (c.address, c.interface) == ("10.0.0.5", "eth0")
    assert choose("eth0", HOST).address == "10.0.0.5"  # IPv4 before IPv6


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("ib1", "no interface or address 'ib1' here"),
        ("10.9.9.9", "no interface here holds the address 10.9.9.9"),
        ("down0", "interface 'down0' has no usable address"),  # only a link-local IPv6
    ],
)
def test_bad_setting_names_what_the_host_has(setting, expected):
    with pytest.raises(InterfaceError, match=expected) as e:
        choose(setting, HOST)
    assert "eth0 10.0.0.5" in str(e.value) and "ib0 192.168.7.5" in str(e.value)


def test_default_rdma_port_interface_then_lighthouse_route_then_host_name():
    ib = RdmaPort("mlx5_0", 1, "InfiniBand", netdev="ib0")
    c = choose(None, HOST, ib, "10.0.0.5", "lh.example")
    assert (c.address, c.interface) == ("192.168.7.5", "ib0") and "RDMA port mlx5_0:1" in c.why
    c = choose(None, HOST, RdmaPort("mlx5_1", 1, "Ethernet", netdev="down0"), "10.0.0.5", "lh.example")
    assert (c.address, c.interface) == ("10.0.0.5", "eth0")
    assert "route to the Lighthouse host lh.example" in c.why and "mlx5_1:1 has no interface with an address" in c.why
    c = choose(None, HOST, None, "10.0.0.5", "lh.example")
    assert (c.address, c.interface, c.bind) == ("10.0.0.5", "eth0", "10.0.0.5")
    c = choose(None, HOST, None, None, "lh.example")
    assert c.bind == "" and "no route to the Lighthouse" in c.why


def test_route_and_interfaces_of_this_host():
    assert route_to("127.0.0.1") == "127.0.0.1"
    assert "127.0.0.1" in local_interfaces()["lo"]
    with pytest.raises(OSError):
        route_to("no-such-host.invalid")


# --------------------------------------------------------------- a simulated host

IN_HOST = textwrap.dedent(
    """
    # Runs inside simulated host 0: picks the address, serves a checkpoint from it.
    import json, sys, torch
    from datetime import timedelta
    from monarch_ft.rank.components.ft import build_transport
    from monarch_ft.config.ft import FTConfig
    from monarch_ft.transport.interface import InterfaceError, resolve

    lighthouse = sys.argv[1]
    out = {"interfaces": sorted(__import__("psutil").net_if_addrs())}
    for setting in (None, "lo", "eth0", sys.argv[2], "ib0"):
        try:
            c = resolve(setting, lighthouse)
            out[str(setting)] = [c.address, c.interface, c.why]
        except InterfaceError as e:
            out[str(setting)] = str(e)
    events = []
    t = build_transport(FTConfig(), timedelta(seconds=30), lighthouse, lambda name, **kw: events.append([name, kw]))
    t.send_checkpoint([1], 3, {"w": torch.arange(1000.0), "torchft": {"step": 3}}, timedelta(seconds=30))
    out.update(events=events, metadata=t.metadata(), bound=t._listener.getsockname()[0])
    print(json.dumps(out), flush=True)
    sys.stdin.read()
    t.shutdown()
    """
)


@pytest.mark.slow
def test_interface_choice_on_a_simulated_host():
    from test_simulated_hosts import _left_behind, _need_netns

    _need_netns()
    from monarch_ft.launcher.hosts import SimulatedHosts

    hosts = SimulatedHosts()
    p = None
    try:
        h = hosts.host(0)
        lighthouse = f"http://{hosts.bridge_address}:29510"  # routing needs no listener
        p = subprocess.Popen(
            ["ip", "netns", "exec", h.netns, sys.executable, "-c", IN_HOST, lighthouse, h.address],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:] if p.poll() is not None else "no output"
        out = json.loads(line)
        assert out["interfaces"] == ["eth0", "lo"]  # the namespace's own, not this machine's
        address, interface, why = out["None"]  # default: no RDMA here, so the route to the Lighthouse
        assert (address, interface) == (h.address, "eth0")
        assert why.startswith(f"route to the Lighthouse host {hosts.bridge_address}"), why
        assert out["lo"][:2] == ["127.0.0.1", "lo"] and out["eth0"][:2] == [h.address, "eth0"]
        assert out[h.address][:2] == [h.address, "eth0"]
        assert out["ib0"].startswith("no interface or address 'ib0' here") and f"eth0 {h.address}" in out["ib0"]
        # the rank's transport binds and advertises that address, and reports why
        assert out["bound"] == h.address and out["metadata"].startswith(f"mft1://{h.address}:")
        assert out["events"] == [["transport_interface", {"address": h.address, "interface": "eth0", "why": why}]]
        # ... and a peer on another host (here: the root namespace, over the bridge) heals from it
        dst = ShardedTransport(timeout=timedelta(seconds=30), backend="tcp")
        try:
            got = dst.recv_checkpoint(0, out["metadata"], 3, timedelta(seconds=30))
        finally:
            dst.shutdown()
        assert torch.equal(got["w"], torch.arange(1000.0)) and got["torchft"]["step"] == 3
    finally:
        if p is not None:
            p.stdin.close()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        hosts.close()
    assert not _left_behind(hosts.id)


# --------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["ft.transport_interface=nope0"], "ft.transport_interface='nope0': no interface or address 'nope0' here"),
        (["ft.transport_interface=203.0.113.77"], "no interface here holds the address 203.0.113.77"),
        (["launcher=local_hosts", "ft.transport_interface=ib0"], "a simulated host has the interfaces eth0, lo"),
    ],
)
def test_bad_transport_interface_fails_with_one_line(tmp_path, overrides, expected):
    res = subprocess.run(
        [sys.executable, str(PRETRAIN), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and expected in errors[0], out
    assert "Traceback" not in out and not (tmp_path / "run" / "events.jsonl").exists()
