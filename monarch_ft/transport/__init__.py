"""Fast, fault-tolerant checkpoint transport for torchft recovery.

``ShardedTransport`` moves one rank's live state dict (weights, optimizer state,
the Manager's own state) from a healthy replica to the recovering one, chunked
over parallel streams with checksums; ``build_checkpoint_transport`` picks a
transport by name for the supervisor.
"""

from monarch_ft.transport.errors import (
    AllPeersFailedError,
    ChecksumMismatchError,
    PeerUnreachableError,
    ProtocolError,
    StaleCheckpointError,
    TransferTimeoutError,
    TransportError,
    TruncatedTransferError,
)

# The transport itself needs torch and torchft; loaded on first use, so that light
# submodules (interface, errors) can be imported by config validation without them.
_LAZY = {
    "build_checkpoint_transport": "monarch_ft.transport.factory",
    "ShardedTransport": "monarch_ft.transport.sharded",
    "format_metadata": "monarch_ft.transport.sharded",
    "parse_metadata": "monarch_ft.transport.sharded",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AllPeersFailedError",
    "ChecksumMismatchError",
    "PeerUnreachableError",
    "ProtocolError",
    "ShardedTransport",
    "StaleCheckpointError",
    "TransferTimeoutError",
    "TransportError",
    "TruncatedTransferError",
    "build_checkpoint_transport",
    "format_metadata",
    "parse_metadata",
]
