"""Read an offline W&B run back (``<run>/wandb/offline-run-*/run-<id>.wandb``), for the tests.

wandb no longer ships a reader for its transaction log in Python; the format is small: a
7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB's log format (32 KiB blocks,
records of ``crc32c:4 length:2 type:1`` headers, a payload split FIRST/MIDDLE/LAST across
blocks), each payload one ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import glob
import json
import os
import struct

_HEADER = 7
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        body = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            yield pending + body
            pending = b""


def offline_runs(run_dir: str) -> list[str]:
    """The transaction logs of the offline W&B runs written under ``run_dir/wandb``."""
    return sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb")))


def run_id(path: str) -> str:
    """A transaction log's run id (its file name's)."""
    return os.path.basename(path)[len("run-") : -len(".wandb")]


def history(path: str) -> list[dict]:
    """Every ``run.log`` row of a run's transaction log, with its ``_step``, in order."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    rows = []
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows
