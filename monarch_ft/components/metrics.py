"""A rank's own report stream: one JSON object per line, appended to a per-rank file.

The supervisor tails these files; it is how it learns step progress (for hang
detection), quorum membership and recovery details without any extra RPC. A file
per rank means no locking and nothing lost when a rank dies mid-write: a torn last
line is simply skipped by the reader.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


class RankReporter:
    def __init__(self, path: str, group: int, rank: int, attempt: int) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "a", buffering=1)
        self.base = {"group": group, "rank": rank, "attempt": attempt, "pid": os.getpid()}

    def _write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({**self.base, **record, "time": record.get("time", time.time())}) + "\n")

    def step(self, **fields: Any) -> None:
        self._write({"type": "step", **fields})

    def event(self, name: str, **fields: Any) -> None:
        self._write({"type": "event", "event": name, **fields})

    def heartbeat(self, **fields: Any) -> None:
        """Liveness while no steps are trained (e.g. holding for a restarting group)."""
        self._write({"type": "heartbeat", **fields})

    def close(self) -> None:
        self._f.close()


class ReportTail:
    """Incrementally reads complete lines appended to a rank's report file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out
