"""One Weights & Biases run per job (``metrics.wandb``), written by the controller, not by the ranks.

Why the controller: it is one process per job and already reads every rank's step records
(``metrics.jsonl``) and every event; a run per rank would be N runs of one job. What it logs, at
each job step: the loss (rank 0 of the first group to commit the step), tokens/s and committed
steps/s; and as they happen, at the step they happen at: restarts (by recovery path), group
failures, faults recovered with their MTTR. ``WANDB_MODE=offline`` (or ``metrics.wandb_mode``) is
honoured as wandb honours it: the run is written under ``<run>/wandb/`` for ``wandb sync``.

A controller that takes the job over resumes the same run (its id, last step and the time of the
last event it logged are kept in ``<run>/wandb.json``): it counts the job's events again from
``events.jsonl`` (the counts go on), and logs those its predecessor had not logged when it was lost.

Fed by the EventLog (a listener) and a reader thread over metrics.jsonl; nothing in the watch loop
calls it.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import uuid
from typing import Any, Optional

from monarch_ft.config.job import JobConfig
from monarch_ft.controller.throughput import StepRate
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog
from monarch_ft.records.layout import RunLayout, atomic_write_json, read_json
from monarch_ft.records.reports import ReportTail

# How often the reader thread logs what arrived.
FLUSH_S = 1.0
RUN_FILE = "wandb.json"


class WandbRun:
    """The job's W&B run.

    Args:
        cfg: the job's config (logged as the run's config).
        layout: the run directory.
        past: the job's events so far (a takeover's; none for a new job).
    """

    def __init__(self, cfg: JobConfig, layout: RunLayout, past: list[dict]) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("metrics.wandb=true needs the wandb package: pip install 'monarch_ft[wandb]' (or drop metrics.wandb)") from None
        self.layout = layout
        self._file = os.path.join(layout.run_dir, RUN_FILE)
        kept = read_json(self._file) or {}
        self.run_id = kept.get("id") or uuid.uuid4().hex[:12]
        self.step = int(kept.get("step", -1))
        self.logged_until = float(kept.get("events_until", 0.0))
        self.counts: dict[str, float] = {}
        self._events: "queue.Queue[dict]" = queue.Queue()
        for e in past:
            if e["time"] <= self.logged_until:
                self._row(e)  # counted; logged already
            else:
                self._events.put(e)
        self._stop = threading.Event()
        self._rate = StepRate()
        self._tail = ReportTail(layout.metrics)
        settings = {"mode": cfg.metrics.wandb_mode} if cfg.metrics.wandb_mode else {}
        self.run = wandb.init(
            project=cfg.metrics.wandb_project,
            id=self.run_id,
            resume="allow",
            dir=layout.run_dir,
            name=os.path.basename(layout.run_dir),
            config=dataclasses.asdict(cfg),
            **settings,
        )
        self._save()
        self._thread = threading.Thread(target=self._loop, name="wandb-run", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        atomic_write_json(self._file, {"id": self.run_id, "step": self.step, "events_until": self.logged_until})

    def on_event(self, e: dict) -> None:
        """The EventLog's listener: counted by the reader thread; the job's end (or a detach) ends the run."""
        if e.get("event") in (EventKind.JOB_FINISHED, EventKind.CONTROLLER_DETACHED):
            self.close(e)
        else:
            self._events.put(e)

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self._flush()

    def _count(self, name: str) -> dict[str, float]:
        self.counts[name] = self.counts.get(name, 0) + 1
        return {name: self.counts[name]}

    def _flush(self) -> None:
        """Log the step records and events that arrived since the last flush."""
        for rec in self._tail.read():
            if rec.get("rank") != 0 or not rec.get("committed") or rec.get("loss") is None or rec["step"] <= self.step:
                continue
            self.step = rec["step"]
            self._rate.observe(float(rec["time"]), self.step + 1)
            row = {"loss": rec["loss"], "tokens_per_s": rec.get("tokens_per_s"), "steps_per_s": self._rate.rate()}
            self.run.log({k: v for k, v in row.items() if v is not None}, step=self.step)
        at = max(self.step, 0)
        while True:
            try:
                e = self._events.get_nowait()
            except queue.Empty:
                break
            row = self._row(e)
            if row:
                self.run.log(row, step=at)
            self.logged_until = max(self.logged_until, float(e["time"]))
        self._save()

    def _row(self, e: dict) -> dict[str, Any]:
        """What an event adds to the run (its counts updated), {} for one it does not log."""
        kind = e.get("event")
        if kind == EventKind.RECOVERY_PATH:
            return {**self._count("restarts"), **self._count(f"restarts/{e.get('path')}")}
        if kind == EventKind.GROUP_FAILED:
            return self._count(f"group_failures/{e.get('reason')}")
        if kind == EventKind.FAULT_RECOVERED:
            return {**self._count("recoveries"), f"mttr_s/{e.get('kind')}": e.get("seconds")}
        if kind == EventKind.FAULT_INJECTED:
            return self._count(f"faults/{e.get('kind')}")
        return {}

    def close(self, end: Optional[dict[str, Any]] = None) -> None:
        """Log what is left and end the run (its summary: how the job ended).

        Args:
            end: the ``job_finished`` event (None: a detach; the next controller resumes the run).
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._flush()
        if end is not None and end.get("event") == EventKind.JOB_FINISHED:
            self.run.summary.update({"status": str(end.get("status")), "job_step": end.get("job_step"), "steps_lost": end.get("steps_lost")})
        self.run.finish()


def start_wandb(cfg: JobConfig, events: EventLog, layout: RunLayout) -> Optional[WandbRun]:
    """The job's W&B run, listening to its events; None without ``metrics.wandb``.

    Args:
        cfg: the job's config.
        events: the job's event log.
        layout: the run directory.

    Raises:
        ConfigError: wandb is not installed.
    """
    if not cfg.metrics.wandb:
        return None
    run = WandbRun(cfg, layout, events.events)
    events.add_listener(run.on_event)
    return run
