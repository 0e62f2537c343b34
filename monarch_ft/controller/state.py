"""What the controller knows of each replica group and each of its ranks.

The watch loop (:mod:`monarch_ft.controller.loop`) updates these from the ranks' reports and
processes; a new controller restores them from ``controller.json``
(:mod:`monarch_ft.controller.takeover`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from monarch_ft.controller.hangs import CpuSample, OsSample
from monarch_ft.launcher.base import RankProcess
from monarch_ft.records.events import GroupStatus
from monarch_ft.records.reports import ReportTail


@dataclass
class RankState:
    proc: RankProcess
    tail: ReportTail
    last_progress: float
    last_step: int = -1
    exited: Optional[int] = None
    train_done: bool = False
    state_hash: Optional[str] = None
    first_step_seen: bool = False
    model_ready: bool = False
    # The main thread's phase, from the rank's liveness beats (records.phases.Phase): the rank's own
    # start time of it, and when this supervisor first saw it (the clock hangs are judged by).
    phase: Optional[str] = None
    phase_since: float = 0.0
    phase_seen: float = 0.0
    # Its OS state, sampled every tick, and since when it has held (controller.hangs.track_os_state).
    os_sample: Optional[OsSample] = None
    # Its CPU seconds, sampled every tick: since when it has used next to none (controller.hangs.track_cpu).
    cpu_sample: Optional[CpuSample] = None
    # The exception that ended it, as it reported it (rank_error: records.reports.error_record), or None.
    error: Optional[dict] = None


@dataclass
class GroupState:
    index: int
    status: GroupStatus = GroupStatus.WAITING
    attempt: int = -1
    restarts: int = 0
    next_launch: float = 0.0
    ranks: list[RankState] = field(default_factory=list)
    last_step: int = -1
    train_done: bool = False
    launched_at: float = 0.0
    losses: list[float] = field(default_factory=list)
    # Checkpoint step the next launch loads before it reports model_ready: -1 the latest
    # (checkpoint.resume), N that step (a full restart), None nothing (it heals or starts);
    # and the verified step directory it loads it from (None: its own folder's copy).
    load_step: Optional[int] = None
    load_path: Optional[str] = None
    # The disk checkpoint this attempt was told to load (step, step directory), and its
    # ranks' checkpoint_load_failed report if the load raised.
    loading: Optional[tuple[int, str]] = None
    load_failure: Optional[dict] = None
    # The gate the next launch waits at before its first step: a shared start gate (first
    # launch, full restart) or its own launch gate (a live relaunch); see _open_launch_gates.
    start_gate: str = ""
    # Its own launch gate was opened (the decision on its state source is written).
    gate_decided: bool = False
    # When it was relaunched, within the restart budget's window (controller.budget.recent_restarts).
    restart_times: list[float] = field(default_factory=list)
    # How its latest attempt failed at start-up (controller.budget.startup_failure), None if it stepped
    # or failed otherwise: the next attempt failing the same way is a crash loop.
    startup_failure: Optional[dict] = None
    # Its latest failure's error, as its ranks reported it (None: none reported; killed, hung).
    last_error: Optional[dict] = None
    # Why it was given up (GiveUpReason), None while it is not.
    gave_up: Optional[str] = None

    @property
    def active(self) -> bool:
        return self.status in (GroupStatus.STARTING, GroupStatus.RUNNING)
