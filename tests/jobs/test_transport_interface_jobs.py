"""The transport's address chosen for real inside a simulated host (a network namespace with
its own interfaces): ft.transport_interface and the default rule."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch

from monarch_ft.testing.jobs import REPO, need_netns, netns_left_behind
from monarch_ft.transport import ShardedTransport

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
    need_netns()
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
    assert not netns_left_behind(hosts.id)
