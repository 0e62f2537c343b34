"""The link probe's wire format: the controller's prober (monarch_ft.controller.link_probe) and
each rank's probe server (monarch_ft.rank.link_probe) speak it over one TCP connection.

A request is a 9-byte header: one op byte (:class:`ProbeOp`) and the payload's size (8 bytes,
big-endian). ``TO_RANK``: the payload follows, the server reads all of it, then answers one
:data:`ACK` byte. ``FROM_RANK``: the server sends that many bytes. Requests repeat on the
connection until the prober closes it. A size over :data:`MAX_BYTES` closes the connection
(the server holds no more than that: nothing else talks to it, but a stray connection must not
make a rank allocate without bound).
"""

from __future__ import annotations

import struct

from monarch_ft.records.events import StrEnum

HEADER = struct.Struct("!cQ")
ACK = b"k"
MAX_BYTES = 8 << 20


class ProbeOp(StrEnum):
    """What a request asks of the server."""

    TO_RANK = "u"  # the prober sends the payload; the server acknowledges it whole
    FROM_RANK = "d"  # the server sends the payload


def pack(op: ProbeOp, size: int) -> bytes:
    return HEADER.pack(op.value.encode(), size)


def unpack(header: bytes) -> tuple[ProbeOp, int]:
    """The request in ``header``; ValueError if it is none of the protocol's (or too large)."""
    op, size = HEADER.unpack(header)
    if size > MAX_BYTES:
        raise ValueError(f"a probe of {size} bytes (at most {MAX_BYTES})")
    return ProbeOp(op.decode("ascii", "replace")), size
