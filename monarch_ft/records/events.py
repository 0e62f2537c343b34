"""The supervisor's event log: every launch, exit, signal, restart and quorum change.

One JSON object per line in ``events.jsonl`` with a wall-clock ``time``; written and
flushed as it happens so that a crash of the supervisor loses nothing already seen,
and kept in memory for the summary and for fault drills that read MTTR phases off it.
"""

from __future__ import annotations

import json
import threading
import time
from enum import Enum
from typing import Any, Callable, Optional


class StrEnum(str, Enum):
    """A name that is also its string: equal to it, and str()/format() give it (as
    enum.StrEnum does from Python 3.11), so events, summaries and console lines read plainly."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class EventKind(StrEnum):
    """Every kind of record in ``events.jsonl``: who writes it, in one place.

    A ``str`` enum, so a kind compares equal to its name as read back from the file.
    """

    # The job, written by the supervisor.
    JOB_STARTED = "job_started"
    LIGHTHOUSE_STARTED = "lighthouse_started"
    LIGHTHOUSE_STOPPED = "lighthouse_stopped"
    LIGHTHOUSE_DIED = "lighthouse_died"
    DATA_READY = "data_ready"
    JOB_RESUMED = "job_resumed"
    TRAINING_STARTED = "training_started"  # a shared start gate opened
    FINISH_REQUESTED = "finish_requested"
    SUPERVISOR_STOP_REQUESTED = "supervisor_stop_requested"
    SUPERVISOR_ERROR = "supervisor_error"
    SUPERVISOR_STALLED = "supervisor_stalled"  # its own loop was held up
    JOB_FINISHED = "job_finished"
    # The job outlives its controller and its Lighthouse (monarch_ft/controller/takeover.py).
    CONTROLLER_LOST = "controller_lost"  # written by the next controller, at the last heartbeat's time
    CONTROLLER_ATTACHED = "controller_attached"  # unsupervised_s: how long the job ran without one
    CONTROLLER_DETACHED = "controller_detached"  # it exited on request, the job still running
    LIGHTHOUSE_LOST = "lighthouse_lost"
    LIGHTHOUSE_RESTARTED = "lighthouse_restarted"  # on the same address
    LIGHTHOUSE_RECOVERED = "lighthouse_recovered"  # the first commit after it: the survivors' stall
    # Groups and ranks, as the supervisor sees them.
    GROUP_LAUNCHED = "group_launched"
    RANK_LAUNCHED = "rank_launched"
    GROUP_STEPPING = "group_stepping"
    RANK_EXITED = "rank_exited"
    GROUP_FAILED = "group_failed"
    GROUP_STOPPED = "group_stopped"
    GROUP_FINISHED = "group_finished"
    RESTART_SCHEDULED = "restart_scheduled"
    RESTART_BUDGET_EXHAUSTED = "restart_budget_exhausted"  # ft.max_restarts relaunches within ft.restart_window_s: given up
    CRASH_LOOP = "crash_loop"  # two launches in a row failed the same way at start-up: given up (controller.budget.crash_loop)
    FULL_RESTART = "full_restart"
    QUORUM_CHANGE = "quorum_change"
    # The job's committed state (monarch_ft.controller.hangs).
    STATE_SOURCE = "state_source"  # where a rejoining group's state comes from
    # A group's copy of a step that failed verification or failed to load, moved aside.
    CHECKPOINT_QUARANTINED = "checkpoint_quarantined"
    # An intact step could not be copied into a group's folder (it loads the source instead).
    CHECKPOINT_COPY_FAILED = "checkpoint_copy_failed"
    JOB_ROLLBACK = "job_rollback"
    JOB_STATE_LOST = "job_state_lost"
    STEP_REGRESSION = "step_regression"
    STEP_REDONE = "step_redone"  # a later quorum committed a step again, with other weights
    JOB_STALL = "job_stall"
    JOB_STALL_CLEARED = "job_stall_cleared"
    JOB_STALL_ESCALATED = "job_stall_escalated"
    # How a failed group came back (RecoveryPath): one per relaunch, before its group_launched
    # (cold_because: why a relaunch without a standby did not fork from a warm fork server).
    RECOVERY_PATH = "recovery_path"
    # Warm standby groups (monarch_ft.controller.standby_pool), written by the supervisor.
    STANDBY_LAUNCHED = "standby_launched"
    STANDBY_READY = "standby_ready"  # every rank built and waiting for a promotion
    STANDBY_PROMOTED = "standby_promoted"  # it took a failed group's identity
    STANDBY_LOST = "standby_lost"  # it died (or was stopped) while waiting; rebuilt, never promoted
    # Warm fork servers (monarch_ft.controller.fork_pool): imports done on a host; one died (restarted).
    FORK_SERVER_READY = "fork_server_ready"
    FORK_SERVER_LOST = "fork_server_lost"
    # Written by the ranks (their report files), relayed by the supervisor.
    RANK_STARTED = "rank_started"
    MODEL_READY = "model_ready"
    CHECKPOINT_LOADED = "checkpoint_loaded"
    CHECKPOINT_MISSING = "checkpoint_missing"
    CHECKPOINT_SAVE_STARTED = "checkpoint_save_started"
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_SAVE_TIMEOUT = "checkpoint_save_timeout"
    # A save the storage refused (errno, path): the partial step removed, training goes on.
    CHECKPOINT_SAVE_FAILED = "checkpoint_save_failed"
    # A load that raised (step, path, error): the rank exits RankExit.CHECKPOINT_LOAD_FAILED.
    CHECKPOINT_LOAD_FAILED = "checkpoint_load_failed"
    CHECKPOINT_SENT = "checkpoint_sent"
    RECOVERY_STARTED = "recovery_started"
    RECOVERY_FAILED = "recovery_failed"
    WEIGHTS_RECOVERED = "weights_recovered"
    COMMIT_REFUSED = "commit_refused"
    TRAIN_DONE = "train_done"
    RANK_FINISHED = "rank_finished"
    RANK_ERROR = "rank_error"  # the exception that ended the rank: its last line and innermost frame (records.reports.error_record)
    CONTROLLER_LEASE_ENDED = "controller_lease_ended"  # a rank ends the job: no controller for controller.lease_s, or stop
    COLLECTIVE_FAULT_INJECTED = "collective_fault_injected"
    SLOW_SAVE_INJECTED = "slow_save_injected"
    # Silent data corruption (monarch_ft.controller.integrity; docs/design/integrity.md).
    # Written by the controller:
    INTEGRITY_INTERVAL = "integrity_interval"
    """ft.integrity_every=auto decided: fingerprint every N steps (every, cost_per_step, why)."""
    SDC_DETECTED = "sdc_detected"
    """Replicas of one committed step disagree (step: the step record it showed in; state_step: the
    state's step; tensors: those that differ): a minority group blamed and failed (group, ranks,
    majority, action fail_group), or with no majority the job rolled back to a checkpoint at or
    before trusted_step (groups, action rollback)."""
    GROUP_SUSPECT = "group_suspect"
    """A group voted against ft.suspect_vetoes commits in a row while its state agreed: failed."""
    CHECKPOINT_SCRUBBED = "checkpoint_scrubbed"
    """checkpoint.scrub_every_s: a pass over the kept steps found damaged copies (steps read, seconds, damaged);
    each is quarantined (checkpoint_quarantined, by the checkpoint scrub)."""
    # Written by the ranks:
    GRAD_OUTLIER = "grad_outlier"
    """A rank's own gradient norm was non-finite or an outlier before the cross-group average:
    its group voted against the commit (TorchFT's report_error) and the step was discarded."""
    BITFLIP_INJECTED = "bitflip_injected"
    """A drill's bit flip done by the rank (step, tensor, index, bit, before, after)."""
    TRANSFER_FAULT_ARMED = "transfer_fault_armed"
    """A test's request to damage the bytes this rank sends when it heals a peer (monarch_ft.records.faults)."""
    # Chaos drills.
    FAULT_INJECTED = "fault_injected"
    FAULT_RECOVERED = "fault_recovered"
    FAULT_RECOVERY_TIMEOUT = "fault_recovery_timeout"
    LINK_RESTORED = "link_restored"


class GroupStatus(StrEnum):
    """A replica group's state in the supervisor's watch loop."""

    STARTING = "starting"  # launched, not stepping yet
    RUNNING = "running"  # stepping (or holding the job open after it finished)
    WAITING = "waiting_restart"  # failed, its relaunch scheduled
    DONE = "done"  # every rank exited 0
    GIVEN_UP = "given_up"  # not relaunched again (GiveUpReason says why)


class GiveUpReason(StrEnum):
    """Why the supervisor stopped relaunching a group (``GroupStatus.GIVEN_UP``)."""

    RESTART_BUDGET = "restart_budget"  # ft.max_restarts relaunches within ft.restart_window_s
    CRASH_LOOP = "crash_loop"  # its last two launches failed the same way at start-up


class StandbyStatus(StrEnum):
    """A warm standby group's state in the supervisor's pool (monarch_ft.controller.standby_pool)."""

    BUILDING = "building"  # launched, building its model
    READY = "ready"  # built, waiting for a promotion file
    PROMOTED = "promoted"  # now a replica group (its ranks belong to that group)
    LOST = "lost"  # died or stopped while waiting; stopped and replaced


class RecoveryPath(StrEnum):
    """How a failed group's replacement came up (``recovery_path`` events, drill reports)."""

    STANDBY = "standby"  # a warm standby group, already built, took the group's identity
    WARM_FORK = "warm_fork"  # ranks forked from an already-imported parent process
    COLD_START = "cold_start"  # fresh interpreters: import, build, shard


class JobStatus(StrEnum):
    """``summary.json``'s status: how the job ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    DEGRADED = "degraded"  # some group gave up, some finished
    REGRESSED = "regressed"  # a commit went below the job's step
    FAILED = "failed"  # every group gave up, or the job's state was lost, or the controller failed
    INTERRUPTED = "interrupted"
    DETACHED = "detached"  # its controller detached; the job went on (controller.json)
    LEASE_EXPIRED = "lease_expired"  # no controller for controller.lease_s: the ranks ended it (monarch_ft.controller.closeout)


# MTTR phases of a fault, in order (chaos.mttr measures them, chaos.report draws them).
PHASES = ("detected", "survivors_stepping", "replacement_up", "weights_recovered", "back_in_quorum")


class EventLog:
    def __init__(self, path: str, echo: Optional[Callable[[dict], None]] = None) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()
        self._echo = echo

    def emit(self, _event: str, **fields: Any) -> dict[str, Any]:
        kind = _event.value if isinstance(_event, Enum) else _event
        record = {"time": fields.pop("time", None) or time.time(), "event": kind, **fields}
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
