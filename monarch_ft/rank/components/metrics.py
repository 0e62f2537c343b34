"""A rank's own report stream: one JSON object per line, appended to a per-rank file.

The supervisor tails these files; it is how it learns step progress (for hang
detection), quorum membership and recovery details without any extra RPC. A file
per rank means no locking and nothing lost when a rank dies mid-write: a torn last
line is simply skipped by the reader.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Optional, Protocol, Sequence

from monarch_ft.records.events import EventKind, event_name


class MetricSink(Protocol):
    """Another consumer of a rank's records (e.g. TensorBoard files); the report file is always written.

    Called under the reporter's lock, from whichever thread reports; an exception turns the
    sink off (it must never stop training), with one line on stderr."""

    def record(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class RankReporter:
    """Appends a rank's records to its report file, and hands each to the ``sinks``.

    Args:
        path: the rank attempt's report file (RunLayout.report).
        group, rank, attempt: stamped on every record.
        sinks: further consumers of every record (see :func:`build_metric_sinks`).
    """

    def __init__(self, path: str, group: int, rank: int, attempt: int, sinks: Sequence[MetricSink] = ()) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "a", buffering=1)
        self.base = {"group": group, "rank": rank, "attempt": attempt, "pid": os.getpid()}
        # TorchFT's threads (checkpoint transport) and watchdog timers report too.
        self._lock = threading.Lock()
        self._sinks = list(sinks)

    def retarget(self, path: str, group: int, attempt: int, sinks: Sequence[MetricSink] = ()) -> None:
        """Report to ``path`` as ``group``/``attempt`` from now on (a promoted warm standby
        takes the failed group's report files; its liveness thread keeps reporting), and to
        ``sinks`` (the group's, e.g. its TensorBoard run) instead of any earlier ones."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        new = open(path, "a", buffering=1)
        with self._lock:
            old, self._f = self._f, new
            self.base = {**self.base, "group": group, "attempt": attempt}
            dropped, self._sinks = self._sinks, list(sinks)
        old.close()
        for sink in dropped:
            sink.close()

    def _write(self, record: dict[str, Any]) -> None:
        record = {**self.base, **record, "time": record.get("time", time.time())}
        line = json.dumps(record) + "\n"
        with self._lock:
            if not self._f.closed:
                self._f.write(line)
                for sink in list(self._sinks):
                    try:
                        sink.record(record)
                    except Exception as e:  # a metrics sink must never stop training
                        self._sinks.remove(sink)
                        print(f"monarch_ft: metrics sink {type(sink).__name__} turned off: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def step(self, **fields: Any) -> None:
        self._write({"type": "step", **fields})

    def event(self, kind: EventKind, **fields: Any) -> None:
        """An event record of ``kind`` (an :class:`EventKind`: an unknown name is refused under tests, see ``event_name``)."""
        self._write({"type": "event", "event": event_name(kind), **fields})

    def heartbeat(self, **fields: Any) -> None:
        """Main-thread progress while no steps are trained (e.g. holding for a restarting group)."""
        self._write({"type": "heartbeat", **fields})

    def liveness(self, **fields: Any) -> None:
        """A beat of the Liveness thread: the main thread's phase, not progress."""
        self._write({"type": "liveness", **fields})

    def close(self) -> None:
        with self._lock:
            self._f.close()
            sinks, self._sinks = self._sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception:
                pass


def build_metric_sinks(cfg, layout, group: int, rank: int, attempt: int) -> list[MetricSink]:
    """The sinks ``metrics.*`` asks for on this rank: TensorBoard files from each group's rank 0.

    Args:
        cfg: the job's ``MetricsConfig``.
        layout: the run's RunLayout (where the files go).
        group, rank, attempt: this rank.
    """
    sinks: list[MetricSink] = []
    if cfg.tensorboard and rank == 0:
        from monarch_ft.rank.components.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(layout, group, attempt, flush_s=cfg.tensorboard_flush_s))
    return sinks


class Liveness:
    """What the rank's main thread is doing, reported by a thread of its own 4 times a second.

    The main thread cannot say "still saving" or "still waiting for the quorum" while it
    is inside the save or the wait, so it only marks each phase as it enters it
    (:meth:`enter`); this thread reports the phase and since when. A rank that reports
    nothing at all is frozen (stopped, or holding the GIL); one in a phase past that
    phase's budget is stuck in it (see monarch_ft.controller.hangs.HangLimits).

    Beats are frequent so that a frozen rank is told in about a second (the hang detector's
    floor, ``ft.hang_min_s``, is a few missed beats); a beat is one short line.

    Args:
        reporter: the rank's report stream.
        interval_s: seconds between beats.
    """

    def __init__(self, reporter: RankReporter, interval_s: float = 0.25) -> None:
        self._reporter = reporter
        self.interval_s = interval_s
        self.phase, self.since = "startup", time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mft-liveness", daemon=True)
        self._thread.start()

    def enter(self, phase: str, fresh: bool = False, since: Optional[float] = None) -> None:
        """Mark the start of ``phase`` (a monarch_ft.records.phases.Phase value). Cheap: no I/O.

        ``fresh``: a new spell of the same phase (localsgd/diloco stay in compute for a
        whole window of inner steps; each step gets the phase's budget anew). ``since``: the
        spell goes on from then (a brief wait inside it marked as another phase is folded back)."""
        if fresh or phase != self.phase or since is not None:
            self.phase, self.since = phase, time.time() if since is None else since

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            phase, since = self.phase, self.since
            self._reporter.liveness(phase=phase, phase_since=since)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2)
