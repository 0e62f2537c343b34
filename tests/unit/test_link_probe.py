"""The link probe over real sockets on this machine: a rank's server (monarch_ft.rank.link_probe)
answers the controller's timed transfers (monarch_ft.controller.link_probe); a rank that does not
answer is left unjudged. The decision on the figures is tests/unit/test_stragglers.py's."""

from __future__ import annotations

import socket
import time

from monarch_ft.common.net import free_port
from monarch_ft.controller.link_probe import LinkProber, time_link
from monarch_ft.controller.stragglers import PROBE_BYTES, PROBE_MIN_EXCESS_S, LinkProbe, ProbeReason
from monarch_ft.rank.link_probe import LinkProbeServer
from monarch_ft.records.probe_wire import HEADER, MAX_BYTES, ProbeOp, pack


def test_a_probe_times_the_payload_each_way_and_the_server_serves_several():
    server = LinkProbeServer("127.0.0.1")
    try:
        for _ in range(2):
            to_rank, from_rank, rtt = time_link(server.address, bytes(PROBE_BYTES))
            assert 0 < to_rank < 1.0 and 0 < from_rank < 1.0 and 0 < rtt < 1.0, (to_rank, from_rank, rtt)
    finally:
        server.close()


class _Starved(LinkProbeServer):
    """A probe server whose thread gets a core ``wait_s`` after each request arrives: what a rank
    starved of CPU (or waiting for its interpreter lock) does to every request, whatever its size."""

    wait_s = 0.03

    def _answer(self, conn: socket.socket) -> None:
        wait_s = self.wait_s

        class Late:
            def __getattr__(self, name):
                return getattr(conn, name)

            def recv_into(self, buf, n=0, flags=0):
                if n == HEADER.size:
                    # The wait starts when the request arrives, not when the last answer went out
                    # (a sleep from then overlapped the prober's own turnaround: 28.6 ms measured).
                    conn.recv(1, socket.MSG_PEEK)
                    time.sleep(wait_s)  # the request's wake-up
                return conn.recv_into(buf, n, flags)

        super()._answer(Late())


def test_a_starved_probe_server_is_slow_in_raw_time_and_at_its_peers_pace_net_of_the_round_trip():
    """A rank kept from a core for 30 ms per request reads 30 ms each way, 70x a healthy loopback
    probe, and would be named a link straggler on that; the empty request's round trip waits as
    long, so its figure (LinkProbe.seconds) is a few milliseconds at most, like a healthy rank's."""
    starved, healthy = _Starved("127.0.0.1"), LinkProbeServer("127.0.0.1")
    try:
        to_rank, from_rank, rtt = time_link(starved.address, bytes(PROBE_BYTES))
        assert min(to_rank, from_rank) >= 0.03 and rtt >= 0.03, (to_rank, from_rank, rtt)
        figure = LinkProbe(0, 0, to_rank, from_rank, rtt).seconds
        peer = LinkProbe(1, 0, *time_link(healthy.address, bytes(PROBE_BYTES))).seconds
        assert figure - peer < PROBE_MIN_EXCESS_S, (figure, peer)
    finally:
        starved.close()
        healthy.close()


class _Slow(_Starved):
    wait_s = 0.1


def test_a_round_probes_each_rank_in_turn_and_lists_those_that_do_not_answer():
    # The first rank answers each request 0.1 s late, so the round is surely running when the
    # second start is refused: with two healthy servers it could end first on a loaded machine
    # (the main thread descheduled for the round's few milliseconds: 2 of 12 runs beside 2 hogs).
    servers = [_Slow("127.0.0.1"), LinkProbeServer("127.0.0.1")]
    gone = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    prober = LinkProber()
    try:
        assert prober.start({(0, 0): servers[0].address, (1, 0): servers[1].address, (2, 0): gone}, ProbeReason.PERIODIC, 7)
        assert not prober.start({(0, 0): servers[0].address}, ProbeReason.PERIODIC, 7)  # one round at a time
        deadline = time.monotonic() + 20
        while (done := prober.take()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert done is not None and not prober.busy
        assert sorted((p.group, p.rank) for p in done.probes) == [(0, 0), (1, 0)] and done.unanswered == [(2, 0)]
        f = done.fields()
        assert f["reason"] == "periodic" and f["step"] == 7 and f["probe_bytes"] == PROBE_BYTES and f["unanswered"] == [[2, 0]]
        assert prober.take() is None
    finally:
        for s in servers:
            s.close()


def test_a_request_larger_than_the_server_holds_closes_the_connection():
    server = LinkProbeServer("127.0.0.1")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(pack(ProbeOp.FROM_RANK, MAX_BYTES + 1))
            assert sock.recv(1) == b""  # closed, nothing sent
        assert time_link(server.address, bytes(1024))[0] > 0  # and it still serves the next
    finally:
        server.close()
