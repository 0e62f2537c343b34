"""The rank's end of the link probe: a tiny TCP server on the rank's own transport address.

Why: in a ring allreduce every group waits for the slowest link, so one group's slow link
lengthens every group's cross-group collective alike and step timings cannot say whose link it
is (monarch_ft.controller.stragglers). The controller therefore times a fixed payload to and
from each rank (monarch_ft.controller.link_probe) and compares the groups. The server listens
on the address the rank advertises to its peers (``advertise_host``), so the probe crosses the
same link the rank's collectives do.

One daemon thread, idle but for a probe (a few hundred KiB each way, and an empty request, now
and then). The payload is read with one ``recv(MSG_WAITALL)`` and sent from a buffer allocated once, with a
send buffer as large as the kernel allows: the probe waits on the link, not on this rank's
interpreter lock, so a busy training loop does not read as a slow link. The wire format is
:mod:`monarch_ft.records.probe_wire`.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Optional

from monarch_ft.records.probe_wire import ACK, HEADER, MAX_BYTES, ProbeOp, unpack

log = logging.getLogger(__name__)


def _read_exactly(conn: socket.socket, n: int, buf: memoryview) -> bool:
    got = 0
    while got < n:
        k = conn.recv_into(buf[got:n], n - got, socket.MSG_WAITALL)
        if k == 0:
            return False
        got += k
    return True


class LinkProbeServer:
    """Serves link probes on ``host`` (an ephemeral port) until :meth:`close`.

    Args:
        host: the rank's advertised address (where its peers reach it).
    """

    def __init__(self, host: str) -> None:
        self._sock = socket.create_server((host, 0))
        # A receive buffer that holds a whole payload (accepted connections inherit it): a
        # payload that has arrived is read at once, so a probe waits for this thread once per
        # request, as an empty request does (controller.stragglers.LinkProbe.seconds nets that
        # wait out), not again part-way through the bytes.
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._buf = bytearray(MAX_BYTES)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="link-probe", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``host:port``, as the rank reports it (``model_ready``'s ``link_probe``)."""
        return f"{self.host}:{self.port}"

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            try:
                with conn:
                    self._answer(conn)
            except (OSError, ValueError) as e:
                log.debug("link probe connection ended: %s", e)

    def _answer(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        view = memoryview(self._buf)
        header = bytearray(HEADER.size)
        while _read_exactly(conn, HEADER.size, memoryview(header)):
            op, size = unpack(bytes(header))
            if op is ProbeOp.TO_RANK:
                if not _read_exactly(conn, size, view):
                    return
                conn.sendall(ACK)
            else:
                conn.sendall(view[:size])

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def start_probe_server(host: str) -> Optional[LinkProbeServer]:
    """The server, or None where it cannot listen on ``host`` (the rank trains on, unprobed:
    the controller then has no figure for it and names no link straggler on its account)."""
    try:
        return LinkProbeServer(host)
    except OSError as e:
        log.warning("no link probe server on %s: %s", host, e)
        return None
