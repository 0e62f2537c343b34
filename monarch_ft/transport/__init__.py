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
from monarch_ft.transport.factory import build_checkpoint_transport
from monarch_ft.transport.sharded import ShardedTransport, format_metadata, parse_metadata

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
