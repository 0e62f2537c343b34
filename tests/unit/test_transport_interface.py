"""The address a rank's checkpoint transport binds and advertises (ft.transport_interface):
the rule as a pure function, this host's interfaces, and a bad value refused with one line
before anything runs. For real inside a simulated host: tests/jobs/test_transport_interface_jobs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import PRETRAIN, REPO
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
