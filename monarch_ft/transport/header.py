"""Wire format: the small header and the framing of messages and chunks.

Why a header: tensor bytes must never be pickled (pickling copies and is slow),
so the sender describes every leaf up front -- pytree path, dtype, shape,
strides, the byte span to ship -- and the receiver preallocates the exact
destination tensors before any tensor byte arrives.  Only this header (and
non-tensor leaves such as ints, strings, the Manager's ``{"step", ...}``) go
through pickle.

Layout of tensor bytes: each tensor ships the minimal span of its storage that
its view touches (``storage_offset`` .. last element), so non-contiguous views
keep their strides without shipping unrelated storage.  Spans are cut and packed
into chunks of about ``chunk_size`` bytes; a chunk is the unit of checksumming,
parallelism and retry.

Frames on a TCP connection:
  message: ``MFTm`` | u32 version | u64 length | pickle(payload)
  chunk:   ``MFTc`` | u8 status | u32 chunk_id | i64 step | u64 nbytes | u32 0 | bytes | u32 crc
           (status 1 = error; then ``nbytes`` of UTF-8 error text follow, no trailer)

The checksum is a *trailer* so both ends can checksum each ~1 MiB window right
after the kernel copied it, while it is still in cache, instead of a separate
pass over DRAM before sending / after receiving.
"""

import hashlib
import pickle
import socket
import struct
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import TreeSpec, keystr, tree_flatten_with_path, tree_unflatten

from monarch_ft.transport.checksum import WINDOW as ck_WINDOW
from monarch_ft.transport.errors import (
    ProtocolError,
    TransferTimeoutError,
    TruncatedTransferError,
)

VERSION = 1
MSG_MAGIC = b"MFTm"
CHUNK_MAGIC = b"MFTc"
MSG_HDR = struct.Struct("!4sIQ")
CHUNK_HDR = struct.Struct("!4sBIqQI")
CRC_TRAILER = struct.Struct("!I")
MAX_MSG = 1 << 31
#: Bytes per send/recv call and checksum update (fits in L2, see module doc).
WINDOW = ck_WINDOW

#: A piece of a chunk: (tensor index, byte offset within the tensor's span, length).
Piece = Tuple[int, int, int]


@dataclass
class DTensorMeta:
    """A DTensor's spec, so that a receiver without a template rebuilds an equal DTensor.

    ``spec`` is the sender's ``DTensorSpec``: device mesh, placements (any kind,
    ``_StridedShard`` included), shard order, global shape, stride and dtype.  It is
    pickled with the header: about 1 KB for a mesh (its rank map, layout and
    process-group names; pickle's memo sends a mesh shared by many DTensors once),
    then ~100 bytes per DTensor, and never the tensor's data.  DeviceMesh pickles
    without its process groups and looks them up by name when unpickled, so a
    receiver whose groups were built the same way -- TorchFT pairs a rank with the
    same rank of another replica group -- gets a mesh equal to its own and working
    collectives.
    """

    spec: Any


@dataclass
class TensorMeta:
    """Describes one tensor leaf; ``nbytes`` is the size of the shipped span."""

    path: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    storage_offset: int  # offset of the view in the *sender's* storage (informational)
    nbytes: int
    device: str
    requires_grad: bool
    dtensor: Optional[DTensorMeta] = None

    def contiguous(self) -> bool:
        return self.nbytes == _numel(self.shape) * _itemsize(self.dtype) and _is_contig(self.shape, self.stride)


@dataclass
class Header:
    """Everything about a staged checkpoint except the tensor bytes."""

    step: int
    gen: int  # bumps on every send_checkpoint; identifies *this* staging
    session: int
    treespec: TreeSpec
    leaves: List[Any]  # non-tensor leaves inline; None at tensor slots
    tensor_slots: List[int]  # leaf index of each tensor
    tensors: List[TensorMeta]
    chunks: List[List[Piece]]
    chunk_nbytes: List[int]
    checksum: str
    fingerprint: str  # hash of the layout: equal fingerprints => chunks interchangeable
    mooncake: Optional[Dict[str, Any]] = None  # {"target": "host:port", "addrs": [...]}
    total_bytes: int = 0


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _is_contig(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> bool:
    expected = 1
    for s, st in reversed(list(zip(shape, stride))):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


def span_elems(t: torch.Tensor) -> int:
    """Number of storage elements the view ``t`` touches starting at its offset."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def byte_view(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A flat uint8 tensor aliasing the span of ``t``'s storage (no copy, any dtype)."""
    off = t.storage_offset() * t.element_size()
    out = torch.empty(0, dtype=torch.uint8)
    if nbytes:
        out.set_(t.untyped_storage(), off, (nbytes,), (1,))
    return out


def memview(u8: torch.Tensor) -> memoryview:
    """A writable memoryview over a CPU uint8 tensor (zero copy)."""
    if u8.numel() == 0:
        return memoryview(bytearray(0))
    return memoryview(u8.numpy()).cast("B")


def _is_dtensor(v: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(v, DTensor)


def _to_plain_cpu(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(f"unsupported tensor layout {t.layout} (only strided tensors are sent)")
    if t.is_quantized or t.device.type == "meta":
        raise ValueError(f"unsupported tensor (quantized or meta): {t.dtype} on {t.device}")
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def build_header(state_dict: Any, step: int, gen: int, chunk_size: int) -> Tuple[Header, List[torch.Tensor]]:
    """Flattens ``state_dict`` into a header plus one uint8 view per tensor span.

    The views alias the caller's CPU tensor memory (device tensors are copied to
    CPU once here), so serving them costs no further copies.
    """
    flat, treespec = tree_flatten_with_path(state_dict)
    leaves: List[Any] = []
    slots: List[int] = []
    metas: List[TensorMeta] = []
    views: List[torch.Tensor] = []
    for i, (path, v) in enumerate(flat):
        if isinstance(v, torch.Tensor):
            dmeta = None
            local = v
            if _is_dtensor(v):
                dmeta = DTensorMeta(v._spec)
                local = v.to_local()
            t = _to_plain_cpu(local)
            nbytes = span_elems(t) * t.element_size()
            metas.append(
                TensorMeta(
                    path=keystr(path),
                    dtype=t.dtype,
                    shape=tuple(t.shape),
                    stride=tuple(t.stride()),
                    storage_offset=int(t.storage_offset()),
                    nbytes=nbytes,
                    device=str(local.device),
                    requires_grad=bool(v.requires_grad),
                    dtensor=dmeta,
                )
            )
            views.append(byte_view(t, nbytes))
            slots.append(i)
            leaves.append(None)
        else:
            leaves.append(v)

    chunks, chunk_nbytes = plan_chunks([m.nbytes for m in metas], chunk_size)
    h = hashlib.sha256()
    for m in metas:
        h.update(repr((m.path, str(m.dtype), m.shape, m.stride, m.nbytes)).encode())
    h.update(repr(chunks).encode())
    header = Header(
        step=step,
        gen=gen,
        session=0,
        treespec=treespec,
        leaves=leaves,
        tensor_slots=slots,
        tensors=metas,
        chunks=chunks,
        chunk_nbytes=chunk_nbytes,
        checksum="",
        fingerprint=h.hexdigest()[:32],
        total_bytes=sum(m.nbytes for m in metas),
    )
    return header, views


def plan_chunks(sizes: List[int], chunk_size: int) -> Tuple[List[List[Piece]], List[int]]:
    """Cuts tensor spans into chunks of ~chunk_size bytes; small tensors share chunks."""
    chunk_size = max(1, chunk_size)
    chunks: List[List[Piece]] = []
    nbytes: List[int] = []
    cur: List[Piece] = []
    cur_n = 0
    for idx, size in enumerate(sizes):
        off = 0
        while off < size:
            n = min(size - off, chunk_size - cur_n)
            cur.append((idx, off, n))
            cur_n += n
            off += n
            if cur_n >= chunk_size:
                chunks.append(cur)
                nbytes.append(cur_n)
                cur, cur_n = [], 0
    if cur:
        chunks.append(cur)
        nbytes.append(cur_n)
    return chunks, nbytes


def unflatten(header: Header, tensors: List[Any]) -> Any:
    leaves = list(header.leaves)
    for slot, t in zip(header.tensor_slots, tensors):
        leaves[slot] = t
    return tree_unflatten(leaves, header.treespec)


# ---------------------------------------------------------------- framing


class Deadline:
    """A wall-clock budget shared by every blocking call of one transfer."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self.end = time.monotonic() + seconds

    def remaining(self, doing: str = "") -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            self.expired(doing)
        return left

    def expired(self, doing: str = "") -> None:
        raise TransferTimeoutError(f"{self.what} timed out after {self.seconds:.1f}s" + (f" while {doing}" if doing else ""))


def send_msg(sock: socket.socket, obj: Any) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(MSG_HDR.pack(MSG_MAGIC, VERSION, len(payload)) + payload)


def recv_exact(sock: socket.socket, mv: memoryview, deadline: Optional[Deadline], doing: str) -> None:
    """Fills ``mv`` from ``sock`` or raises a timeout / truncation error."""
    got = 0
    n = len(mv)
    while got < n:
        if deadline is not None:
            sock.settimeout(deadline.remaining(doing))
        try:
            r = sock.recv_into(mv[got:], n - got)
        except socket.timeout:
            if deadline is not None:
                deadline.expired(doing)
            raise
        except OSError as e:
            raise TruncatedTransferError(f"connection lost while {doing}: {e}") from e
        if r == 0:
            raise TruncatedTransferError(f"peer closed the connection while {doing} ({got} of {n} bytes received)")
        got += r


def recv_msg(sock: socket.socket, deadline: Optional[Deadline], doing: str) -> Any:
    buf = bytearray(MSG_HDR.size)
    recv_exact(sock, memoryview(buf), deadline, doing)
    magic, version, length = MSG_HDR.unpack(buf)
    if magic != MSG_MAGIC:
        raise ProtocolError(f"bad message magic {magic!r} while {doing}")
    if version != VERSION:
        raise ProtocolError(f"peer speaks wire version {version}, we speak {VERSION}")
    if length > MAX_MSG:
        raise ProtocolError(f"message of {length} bytes is too large while {doing}")
    payload = bytearray(length)
    recv_exact(sock, memoryview(payload), deadline, doing)
    with warnings.catch_warnings():  # torch's TreeSpec unpickling warns about LeafSpec
        warnings.simplefilter("ignore", FutureWarning)
        return pickle.loads(payload)
