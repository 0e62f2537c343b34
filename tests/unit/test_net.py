"""Free ports for processes that bind them later (monarch_ft.common.net.free_port)."""

from __future__ import annotations

import socket

from monarch_ft.common.net import PORT_FLOOR, ephemeral_range, free_port


def test_a_free_port_is_below_the_ephemeral_range_bindable_and_not_handed_out_twice():
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(300)]
    # Below the range that outbound connections draw from: only a bind can take one.
    assert all(PORT_FLOOR <= p < low for p in ports), sorted(ports)[-3:]
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    # An address this namespace doesn't hold: a port free on loopback.
    assert PORT_FLOOR <= free_port("192.0.2.1") < low


def test_the_ephemeral_range_is_read_from_the_kernel_or_linuxs_default(tmp_path):
    good, bad = tmp_path / "range", tmp_path / "bad"
    good.write_text("40000\t50000\n")
    bad.write_text("not a range\n")
    assert ephemeral_range(str(good)) == (40000, 50000)
    assert ephemeral_range(str(bad)) == ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
