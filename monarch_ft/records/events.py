"""The supervisor's event log: every launch, exit, signal, restart and quorum change.

One JSON object per line in ``events.jsonl`` with a wall-clock ``time``; written and
flushed as it happens so that a crash of the supervisor loses nothing already seen,
and kept in memory for the summary and for fault drills that read MTTR phases off it.
"""

from __future__ import annotations

import json
import os
import sys
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
    """Every kind of record in ``events.jsonl``, and of ``event`` record in a rank's report file: who writes it, in one place.

    A ``str`` enum, so a kind compares equal to its name as read back from the file. Every
    emitter names its kind by a member (a fast test walks the code for any other name), and the
    event log and the rank reporter refuse an unknown one under tests (:func:`event_name`).
    """

    # The job, written by the controller.
    JOB_STARTED = "job_started"
    """A controller started a new job (its groups, ranks, transport and launcher)."""
    LIGHTHOUSE_STARTED = "lighthouse_started"
    """The Lighthouse is up (its address and pid), or the one at ``ft.lighthouse_addr`` answered."""
    LIGHTHOUSE_STOPPED = "lighthouse_stopped"
    """The controller stopped the Lighthouse it started, at the job's end."""
    DATA_READY = "data_ready"
    """The token file is prepared (tokens, vocabulary size, seconds it took, ``data.path``)."""
    JOB_RESUMED = "job_resumed"
    """``checkpoint.resume``: every group loads this step (null: none was on disk; training starts afresh)."""
    TRAINING_STARTED = "training_started"
    """A shared start gate opened: every group waiting at it has built its model and loaded its state (or waited ``ft.startup_timeout_s``)."""
    FINISH_REQUESTED = "finish_requested"
    """The job will finish at ``step`` (a drill's end, or a ``stop`` command)."""
    SUPERVISOR_STOP_REQUESTED = "supervisor_stop_requested"
    """The controller was asked to stop (SIGINT, SIGTERM): it stops the job."""
    SUPERVISOR_ERROR = "supervisor_error"
    """The controller failed with an exception (its type and message); the job ends ``failed``."""
    SUPERVISOR_STALLED = "supervisor_stalled"
    """The controller's own watch loop was held up this many seconds (no CPU, a blocked filesystem): that window does not count as the ranks' silence."""
    JOB_FINISHED = "job_finished"
    """The job ended: its status (JobStatus), seconds, committed step and steps lost."""
    # The controller and the Lighthouse, which the job outlives (monarch_ft/controller/takeover.py).
    CONTROLLER_LOST = "controller_lost"
    """Written by the next controller, at the time of the last heartbeat of the one that was lost."""
    CONTROLLER_ATTACHED = "controller_attached"
    """A controller took over the running job; ``unsupervised_s``: how long the job ran without one."""
    CONTROLLER_DETACHED = "controller_detached"
    """The controller exited on request (SIGUSR2), the job still running."""
    LIGHTHOUSE_LOST = "lighthouse_lost"
    """The Lighthouse the controller started died (its exit described)."""
    LIGHTHOUSE_RESTARTED = "lighthouse_restarted"
    """The Lighthouse was started again, on the same address; ``down_s``: how long it was gone."""
    LIGHTHOUSE_RECOVERED = "lighthouse_recovered"
    """The first commit after a Lighthouse restart; ``stall_s``: the survivors' stall."""
    # Groups and ranks, as the controller sees them.
    GROUP_LAUNCHED = "group_launched"
    """A group attempt's ranks were launched (or a standby promoted into it: ``standby``):
    ``forked`` whether they came from the host's fork server, else ``cold_because`` (first launches)."""
    RANK_LAUNCHED = "rank_launched"
    """One rank of a launched group: its pid and host."""
    GROUP_STEPPING = "group_stepping"
    """A group attempt reported its first step."""
    RANK_EXITED = "rank_exited"
    """A rank's process ended: its exit code and what it means (RankExit, a signal)."""
    GROUP_FAILED = "group_failed"
    """A group failed (why: a rank's exit, a hang, a startup timeout...); its ranks are stopped."""
    GROUP_STOPPED = "group_stopped"
    """A group's ranks were stopped (after a failure, for a full restart, or at the job's end)."""
    STRAGGLER_DETECTED = "straggler_detected"
    """A group is slower than ``ft.straggler_factor`` x its peers' median (controller.stragglers): ``slow_kind`` cpu (its own
    seconds per step, the iteration less its waits for the peers, over the steps judged) or link (a probe's seconds for
    ``probe_bytes``, with Mbit/s); its slowest rank, its figure, the peers' median, the ratio."""
    LINK_PROBED = "link_probed"
    """A probe round timed every rank's link (controller.link_probe): why it ran (ProbeReason), each rank's seconds each
    way and its empty request's round trip (``rtt_s``), the unanswered."""
    STRAGGLER_CLEARED = "straggler_cleared"
    """A group named a straggler is back to its peers' pace (or was replaced)."""
    STRAGGLER_EVICTED = "straggler_evicted"
    """``ft.straggler=evict``: the straggler is failed and a ready standby takes its place (the rule's figures: its loss, one recovery's cost)."""
    STRAGGLER_KEPT = "straggler_kept"
    """``ft.straggler=evict`` kept a straggler, and why (no standby ready, the restart budget, it would not pay)."""
    HOST_EXCLUDED = "host_excluded"
    """A host (launcher slot) is left out of later placements, and why (a straggler evicted from it)."""
    HOST_RETURNED = "host_returned"
    """An excluded host may be placed on again (the slowness that excluded it ended)."""
    GROUP_FINISHED = "group_finished"
    """Every rank of a group exited 0: it trained every step."""
    RESTART_SCHEDULED = "restart_scheduled"
    """A failed group will be relaunched after ``backoff_s`` (``counted``: false when it costs no restart of the budget)."""
    RESTART_BUDGET_EXHAUSTED = "restart_budget_exhausted"
    """``ft.max_restarts`` relaunches within ``ft.restart_window_s``: the group is given up."""
    CRASH_LOOP = "crash_loop"
    """Two launches in a row failed the same way at start-up: the group is given up (controller.budget.crash_loop)."""
    FULL_RESTART = "full_restart"
    """Every group is stopped and relaunched from one disk checkpoint (``ft.recovery=full_restart``, or a job-wide stall)."""
    QUORUM_CHANGE = "quorum_change"
    """The groups taking part in committed steps changed."""
    # The job's committed state (monarch_ft.controller.hangs, monarch_ft.controller.checkpoints).
    STATE_SOURCE = "state_source"
    """Where a rejoining group's state comes from (StateSource: a live peer, a disk checkpoint, or none) and at which step."""
    CHECKPOINT_QUARANTINED = "checkpoint_quarantined"
    """A group's copy of a step that failed verification or failed to load, moved aside (nothing deleted)."""
    CHECKPOINT_COPY_FAILED = "checkpoint_copy_failed"
    """An intact step could not be copied into a group's folder (the group loads the source instead)."""
    JOB_ROLLBACK = "job_rollback"
    """The job went back to a disk checkpoint below its committed step: ``steps_lost`` steps are trained again."""
    JOB_STATE_LOST = "job_state_lost"
    """No live group and no intact checkpoint hold the job's state: the job stops (the message says what was tried)."""
    STEP_REGRESSION = "step_regression"
    """A commit went below the job's committed step (the ranks refuse such commits; this is the second line)."""
    STEP_REDONE = "step_redone"
    """A later quorum committed a step again, with other weights."""
    JOB_STALL = "job_stall"
    """Every stepping group was silent at once: one job-wide stall (stacks captured), not N faults."""
    JOB_STALL_CLEARED = "job_stall_cleared"
    """The job-wide stall ended by itself within ``ft.stall_timeout_s``."""
    JOB_STALL_ESCALATED = "job_stall_escalated"
    """The job-wide stall outlasted ``ft.stall_timeout_s``: the whole job resumes from its newest checkpoint."""
    RECOVERY_PATH = "recovery_path"
    """How a failed group comes back (RecoveryPath): one per relaunch, before its ``group_launched``
    (``cold_because``: why a relaunch without a standby did not fork from a warm fork server)."""
    # Warm standby groups (monarch_ft.controller.standby_pool), written by the controller.
    STANDBY_LAUNCHED = "standby_launched"
    """A standby group's ranks were launched (niced and under ``SCHED_IDLE``, to build in the background)."""
    STANDBY_READY = "standby_ready"
    """Every rank of the standby built and waiting for a promotion; in a standby rank's report, that rank."""
    STANDBY_PROMOTED = "standby_promoted"
    """A ready standby took a failed group's identity."""
    STANDBY_LOST = "standby_lost"
    """A standby died (or was stopped) while waiting; it is rebuilt, never promoted."""
    # The nodes of a cluster (launcher=slurm; monarch_ft.controller.decide.job.nodes applies
    # monarch_ft.controller.placement's rules).
    GROUP_PLACED = "group_placed"
    """A group's or a standby's allocation started: the node the scheduler gave it (node,
    job_id; group, or standby) and allocation_s, from its submission to its first rank running."""
    NODE_STATE = "node_state"
    """The scheduler's view of a node changed: state (its own words, e.g. Slurm's idle*, down*),
    health (NodeHealth), previous. Slurm's own detection of a failed node is the first
    not_responding after the fault."""
    NODE_EXCLUDED = "node_excluded"
    """The controller keeps new allocations off a node: node, reason (ExclusionReason), the
    group and attempt that failed there, and the nodes excluded now."""
    NODE_RETURNED = "node_returned"
    """An excluded node is back in the pool: node, reason (ReturnReason), excluded_s."""
    ALLOCATION_REPLANNED = "allocation_replanned"
    """An allocation the scheduler holds pending was given the nodes to keep off now (job_id,
    excluded_before, excluded): a node came back, or another failed, while it waited."""
    NODE_RESTORED = "node_restored"
    """A node that a node fault took down is back (link up, slurmd started again, resumed):
    node, lasted_s. The scheduler's node_state shows when it counts it up again."""
    # Warm fork servers (monarch_ft.controller.fork_pool).
    FORK_SERVER_READY = "fork_server_ready"
    """A fork server finished its imports on a host (in ``import_s``, at ``import_niceness``): relaunches there fork from it."""
    FORK_SERVER_LOST = "fork_server_lost"
    """A fork server died (its exit code, whether it had been ready); it is restarted."""
    # Written by the ranks (their report files), relayed by the controller.
    RANK_STARTED = "rank_started"
    """A rank's process is up (for a promoted standby rank: once it took its group, with the promotion's latency)."""
    STANDBY_PROMOTED_RANK = "standby_promoted_rank"
    """A standby rank read its promotion: the group and attempt it becomes, and how long it waited."""
    STANDBY_ORPHANED = "standby_orphaned"
    """A waiting standby rank's controller is gone (nothing will promote it): it exits, freeing what it holds."""
    TRANSPORT_INTERFACE = "transport_interface"
    """Where the rank's sharded checkpoint transport binds and what it advertises, and why (``ft.transport_interface``)."""
    MODEL_READY = "model_ready"
    """The rank built its model, optimizer and transport (its parameters, device and backends)."""
    CHECKPOINT_LOADED = "checkpoint_loaded"
    """The rank loaded its group's disk checkpoint at ``step``."""
    CHECKPOINT_MISSING = "checkpoint_missing"
    """The rank found no disk checkpoint to load: it starts from the initial weights or heals from a peer."""
    CHECKPOINT_SAVE_STARTED = "checkpoint_save_started"
    """The rank began saving ``step`` (its watchdog armed for ``checkpoint.save_timeout_s``)."""
    CHECKPOINT_SAVED = "checkpoint_saved"
    """The rank's save of ``step`` finished, in ``seconds``."""
    CHECKPOINT_SAVE_TIMEOUT = "checkpoint_save_timeout"
    """A save outlived ``checkpoint.save_timeout_s``: the rank dumped its stacks and exits."""
    CHECKPOINT_SAVE_FAILED = "checkpoint_save_failed"
    """A save the storage refused (errno, path): the partial step removed, training goes on."""
    CHECKPOINT_LOAD_FAILED = "checkpoint_load_failed"
    """A load that raised (step, path, error): the rank exits RankExit.CHECKPOINT_LOAD_FAILED."""
    CHECKPOINT_SENT = "checkpoint_sent"
    """The rank sent its state to a healing peer (ranks, step, seconds)."""
    RECOVERY_STARTED = "recovery_started"
    """The rank began receiving its state from a live peer (the controller adds the peer's group)."""
    RECOVERY_FAILED = "recovery_failed"
    """Receiving the state from a peer failed (the error)."""
    WEIGHTS_RECOVERED = "weights_recovered"
    """The rank received its state from a peer: bytes and seconds."""
    RANK_FROZE = "rank_froze"
    """The rank did not run for ``frozen_s`` (over ``ft.heartbeat_timeout_ms``): its next quorum request waited ``waited_s`` (rank.components.freeze)."""
    COMMIT_REFUSED = "commit_refused"
    """The rank refused to commit a step below the job's committed step (rank.components.ft.CommitFloor)."""
    TRAIN_DONE = "train_done"
    """The rank trained its last step; it keeps serving quorums while the job is held open."""
    RANK_FINISHED = "rank_finished"
    """The rank ends cleanly (it exits 0 right after): steps trained and the final state's hash."""
    RANK_ERROR = "rank_error"
    """The exception that ended the rank: its last line and innermost frame (records.reports.error_record)."""
    CONTROLLER_LEASE_ENDED = "controller_lease_ended"
    """The rank ends the job by itself: no controller for ``controller.lease_s``, or an unanswered stop."""
    # Chaos drills: the rank's side of a fault (its fault agent).
    COLLECTIVE_FAULT_INJECTED = "collective_fault_injected"
    """The rank acted on a ``collective`` fault at its allreduce (abort or hang)."""
    SLOW_SAVE_INJECTED = "slow_save_injected"
    """The rank's checkpoint save is slowed by a fault (``delay_s``)."""
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
    # Chaos drills, written by the injector in the controller.
    FAULT_INJECTED = "fault_injected"
    """A fault was done (its kind, target and what was done)."""
    FAULT_REQUESTED = "fault_requested"
    """A fault asked for while the drill runs (``chaos.on_demand``: ``JobHandle.inject``) joined the queue as ``fault_id``."""
    FAULT_REQUEST_REFUSED = "fault_request_refused"
    """A fault asked for while the drill runs was refused: ``error``, one line naming the fix."""
    FAULT_RECOVERED = "fault_recovered"
    """The fault is recovered (records.recovered): the MTTR clock stops."""
    FAULT_RECOVERY_TIMEOUT = "fault_recovery_timeout"
    """The fault did not recover within ``chaos.recovery_timeout_s``."""
    LINK_RESTORED = "link_restored"
    """A network fault's link is back (it lasted ``lasted_s``)."""
    SLOWDOWN_ENDED = "slowdown_ended"
    """A ``slow`` fault's CPU limit is lifted (its mechanism, cgroup or sigstop, and how long it lasted)."""


class GroupStatus(StrEnum):
    """A replica group's state in the supervisor's watch loop."""

    STARTING = "starting"
    """Launched, not stepping yet."""
    RUNNING = "running"
    """Stepping (or holding the job open after it finished)."""
    STOPPED = "stopped"
    """Its ranks were stopped (it failed, or a full restart stopped it); what comes next is
    decided in the same tick, once the facts it needs (the newest intact checkpoint) are found."""
    WAITING = "waiting_restart"
    """Failed, its relaunch scheduled."""
    DONE = "done"
    """Every rank exited 0."""
    GIVEN_UP = "given_up"
    """Not relaunched again (GiveUpReason says why)."""


class GiveUpReason(StrEnum):
    """Why the supervisor stopped relaunching a group (``GroupStatus.GIVEN_UP``)."""

    RESTART_BUDGET = "restart_budget"
    """``ft.max_restarts`` relaunches within ``ft.restart_window_s``, and it failed again."""
    CRASH_LOOP = "crash_loop"
    """Its last two launches failed the same way at start-up."""


class StandbyStatus(StrEnum):
    """A warm standby group's state in the supervisor's pool (monarch_ft.controller.standby_pool)."""

    BUILDING = "building"
    """Launched, building its model."""
    READY = "ready"
    """Built, waiting for a promotion file."""
    PROMOTED = "promoted"
    """Now a replica group (its ranks belong to that group)."""
    LOST = "lost"
    """Died or stopped while waiting; stopped and replaced."""


class RecoveryPath(StrEnum):
    """How a failed group's replacement came up (``recovery_path`` events, drill reports)."""

    STANDBY = "standby"
    """A warm standby group, already built, took the group's identity."""
    WARM_FORK = "warm_fork"
    """Ranks forked from an already-imported parent process (a warm fork server)."""
    COLD_START = "cold_start"
    """Fresh interpreters: import, build, shard."""


class NodeHealth(StrEnum):
    """What the scheduler's state of a node says of it (a launcher reads its own words: Slurm's
    ``sinfo`` states, monarch_ft.launcher.slurm.node_health)."""

    UP = "up"
    """Answering, runs jobs."""
    NOT_RESPONDING = "not_responding"
    """Its daemon misses the scheduler's pings (Slurm: a "*" suffix)."""
    DOWN = "down"
    """The scheduler took it out as failed (Slurm: DOWN, FAIL)."""
    OUT = "out"
    """Taken out otherwise (drained by an admin, rebooting, powered down): no new jobs."""


class ExclusionReason(StrEnum):
    """Why the controller keeps new allocations off a node (``node_excluded``)."""

    RANKS_LOST = "ranks_lost"
    """Every rank of a group on it vanished at once, none recording how it ended."""
    NOT_RESPONDING = "not_responding"
    """The scheduler counted it not responding or down when a group on it failed."""
    STRAGGLER = "straggler"
    """A straggler (slow CPU or link) was evicted from it (``ft.straggler=evict``)."""


class ReturnReason(StrEnum):
    """Why an excluded node is back in the pool (``node_returned``)."""

    BACK_UP = "back_up"
    """The scheduler counted it failed, then up again (its daemon back, resumed)."""
    NEVER_DOWN = "never_down"
    """The scheduler counted it up all along for ft.node_probation_s: a false suspicion."""


class JobStatus(StrEnum):
    """``summary.json``'s status: how the job ended."""

    RUNNING = "running"
    """Not ended yet (the controller's state while it watches the job)."""
    COMPLETED = "completed"
    """Every group finished (trained every step)."""
    DEGRADED = "degraded"
    """Some group gave up, some finished."""
    REGRESSED = "regressed"
    """A commit went below the job's step."""
    FAILED = "failed"
    """Every group gave up, or the job's state was lost, or the controller failed."""
    INTERRUPTED = "interrupted"
    """The controller was stopped (SIGINT, SIGTERM) and stopped the job."""
    DETACHED = "detached"
    """Its controller detached; the job went on (controller.json)."""
    LEASE_EXPIRED = "lease_expired"
    """No controller for ``controller.lease_s``: the ranks ended it (monarch_ft.controller.closeout)."""


# MTTR phases of a fault, in order (chaos.mttr measures them, chaos.report draws them).
PHASES = ("detected", "survivors_stepping", "replacement_up", "weights_recovered", "back_in_quorum")


# Set to 1 by the test suite (tests/conftest.py) and inherited by every process a job test
# starts: a kind that is not an EventKind member then raises where it is written, so a new
# event name cannot reach a report or events.jsonl without its entry (and doc) in EventKind.
STRICT_EVENTS_ENV = "MONARCH_FT_STRICT_EVENTS"
_warned: set[str] = set()


def event_name(kind: "EventKind | str") -> str:
    """``kind`` as it is written on disk (the member's value).

    A plain string is taken when it names a member. Any other name raises ``ValueError`` under
    :data:`STRICT_EVENTS_ENV`; otherwise it is written as is with one warning on stderr: a
    record relayed from a rank of another version is kept, never dropped.
    """
    if isinstance(kind, EventKind):
        return kind.value
    if kind in EventKind._value2member_map_:
        return str(kind)
    if os.environ.get(STRICT_EVENTS_ENV) == "1":
        raise ValueError(f"event kind {kind!r} is not in monarch_ft.records.events.EventKind: add it there, with its doc")
    if kind not in _warned:
        _warned.add(kind)
        print(f"monarch_ft: warning: event kind {kind!r} is not in EventKind; written as is", file=sys.stderr, flush=True)
    return str(kind)


class EventLog:
    """``events.jsonl``, appended and flushed as each event happens, and kept in memory.

    A write the file system refuses (a full disk, a read-only one) does not raise where the
    event is emitted (a signal handler, a helper thread, the job's end): the first failure is
    kept (:attr:`write_error`) for the controller to act on, later events stay in memory only.

    Args:
        path: the file.
        echo: called with each record (the console).
        clock: the time of an event given none (a fast test's fake clock; default ``time.time``).
    """

    def __init__(self, path: str, echo: Optional[Callable[[dict], None]] = None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()
        self._echo = echo
        self._clock = clock
        # The first write the file system refused (its filename set), or None.
        self.write_error: Optional[OSError] = None
        self._listeners: list[Callable[[dict], None]] = []

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener`` with each record emitted from now on, after it is written and echoed
        (in the emitting thread: the controller's). What reports the job elsewhere (a metrics
        endpoint) listens here instead of being called from the loop.

        Args:
            listener: called with the record; it must not raise (what it does is its own business).
        """
        self._listeners.append(listener)

    def emit(self, _event: EventKind, **fields: Any) -> dict[str, Any]:
        """Write one event of kind ``_event`` (an :class:`EventKind`; see :func:`event_name`) with ``fields``; returns the record."""
        kind = event_name(_event)
        record = {"time": fields.pop("time", None) or self._clock(), "event": kind, **fields}
        with self._lock:
            self.events.append(record)
            if self.write_error is None:
                try:
                    self._f.write(json.dumps(record, default=str) + "\n")
                except OSError as e:
                    e.filename = e.filename or self.path
                    self.write_error = e
        if self._echo is not None:
            self._echo(record)
        for listener in self._listeners:
            listener(record)
        return record

    def find(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]

    def close(self) -> None:
        try:
            self._f.close()
        except OSError as e:
            if self.write_error is None:
                e.filename = e.filename or self.path
                self.write_error = e


def event_node(record: dict[str, Any]) -> Optional[str]:
    """The cluster node an event names (``node_state``, ``node_excluded``, ``node_returned``,
    ``node_restored``, ``group_placed``, a node fault's ``fault_injected``), None for others."""
    return record.get("node")
