"""A rank's own report stream: one JSON object per line, appended to a per-rank file.

The supervisor tails these files; it is how it learns step progress (for hang
detection), quorum membership and recovery details without any extra RPC. A file
per rank means no locking and nothing lost when a rank dies mid-write: a torn last
line is simply skipped by the reader.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class RankReporter:
    def __init__(self, path: str, group: int, rank: int, attempt: int) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "a", buffering=1)
        self.base = {"group": group, "rank": rank, "attempt": attempt, "pid": os.getpid()}
        # TorchFT's threads (checkpoint transport) and watchdog timers report too.
        self._lock = threading.Lock()

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({**self.base, **record, "time": record.get("time", time.time())}) + "\n"
        with self._lock:
            if not self._f.closed:
                self._f.write(line)

    def step(self, **fields: Any) -> None:
        self._write({"type": "step", **fields})

    def event(self, name: str, **fields: Any) -> None:
        self._write({"type": "event", "event": name, **fields})

    def heartbeat(self, **fields: Any) -> None:
        """Main-thread progress while no steps are trained (e.g. holding for a restarting group)."""
        self._write({"type": "heartbeat", **fields})

    def liveness(self, **fields: Any) -> None:
        """A beat of the Liveness thread: the main thread's phase, not progress."""
        self._write({"type": "liveness", **fields})

    def close(self) -> None:
        with self._lock:
            self._f.close()


class Liveness:
    """What the rank's main thread is doing, reported by a thread of its own once a second.

    The main thread cannot say "still saving" or "still waiting for the quorum" while it
    is inside the save or the wait, so it only marks each phase as it enters it
    (:meth:`enter`); this thread reports the phase and since when. A rank that reports
    nothing at all is frozen (stopped, or holding the GIL); one in a phase past that
    phase's budget is stuck in it (see monarch_ft.recovery.HangLimits).

    Args:
        reporter: the rank's report stream.
        interval_s: seconds between beats.
    """

    def __init__(self, reporter: RankReporter, interval_s: float = 1.0) -> None:
        self._reporter = reporter
        self.interval_s = interval_s
        self.phase, self.since = "startup", time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mft-liveness", daemon=True)
        self._thread.start()

    def enter(self, phase: str, fresh: bool = False) -> None:
        """Mark the start of ``phase`` (a monarch_ft.recovery.Phase value). Cheap: no I/O.

        ``fresh``: a new spell of the same phase (localsgd/diloco stay in compute for a
        whole window of inner steps; each step gets the phase's budget anew)."""
        if fresh or phase != self.phase:
            self.phase, self.since = phase, time.time()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            phase, since = self.phase, self.since
            self._reporter.liveness(phase=phase, phase_since=since)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2)


class ReportTail:
    """Incrementally reads complete lines appended to a rank's report file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    @property
    def position(self) -> int:
        """Byte offset of the first line not returned yet (what a new controller resumes at)."""
        return self._offset - len(self._partial)

    def seek(self, position: int) -> None:
        self._offset, self._partial = position, b""

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
