"""Exceptions raised by the sharded checkpoint transport.

Recovery code (the torchft Manager, our supervisor) only needs to know *that* a
transfer failed and *why*, in one line it can log.  Each failure mode gets its
own type so tests and callers can tell a corrupt shard from a slow peer, and
every subclass is a ``RuntimeError`` so generic handlers keep working.
"""


class TransportError(RuntimeError):
    """Base class of every error raised by ``monarch_ft.transport``."""


class TransferTimeoutError(TransportError, TimeoutError):
    """The transfer did not finish within its timeout ("timed out" is in the message)."""


class ChecksumMismatchError(TransportError):
    """A chunk arrived with bytes that do not match the sender's checksum."""


class TruncatedTransferError(TransportError):
    """The peer closed the stream before a chunk was complete."""


class StaleCheckpointError(TransportError):
    """The peer serves a different step than requested, or stopped serving it."""


class ProtocolError(TransportError):
    """The peer sent bytes that do not follow the wire format."""


class AllPeersFailedError(TransportError):
    """Every peer that could serve the checkpoint failed; the message lists why."""


class PeerUnreachableError(TransportError, ConnectionError):
    """The peer's address refused or dropped the connection attempt."""
