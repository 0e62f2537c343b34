"""The supervisor's event log: every launch, exit, signal, restart and quorum change.

One JSON object per line in ``events.jsonl`` with a wall-clock ``time``; written and
flushed as it happens so that a crash of the supervisor loses nothing already seen,
and kept in memory for the summary and for fault drills that read MTTR phases off it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Optional


class EventLog:
    def __init__(self, path: str, echo: Optional[Callable[[dict], None]] = None) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()
        self._echo = echo

    def emit(self, _event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": fields.pop("time", None) or time.time(), "event": _event, **fields}
        with self._lock:
            self.events.append(record)
            self._f.write(json.dumps(record, default=str) + "\n")
        if self._echo is not None:
            self._echo(record)
        return record

    def find(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]

    def close(self) -> None:
        self._f.close()


def read_events(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
