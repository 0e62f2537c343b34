"""All the controller knows of a job: :class:`JobState`, declared up front in groups.

The watch loop (:mod:`monarch_ft.controller.loop`) updates it from the ranks' reports and
processes, the :class:`~monarch_ft.controller.planner.RecoveryPlanner` decides from it, and a
new controller restores it from ``controller.json`` (:mod:`monarch_ft.controller.takeover`).
Snapshot and restore are generic (:mod:`monarch_ft.controller.snapshot`): every field is carried
over unless it is declared :func:`~monarch_ft.controller.snapshot.live` (a handle on something
running, rebuilt by the takeover: a rank's process and report tail) or
:func:`~monarch_ft.controller.snapshot.own` (this controller's own view: its samples of the
ranks, what it printed, caches). Parts owned by one component are declared in its module and
composed here: the ledger (:class:`CommitLedger`), the step times (:class:`StepTimeLearner`),
the standby and fork pools' counters, a cluster's nodes (:class:`~monarch_ft.controller.placement.NodePool`).

A group's status changes through :meth:`GroupState.move` only, which refuses a transition not
in :data:`TRANSITIONS`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from monarch_ft.controller.checkpoints import CheckpointHealth, Recovered
from monarch_ft.controller.fork_pool import ForkPoolState
from monarch_ft.controller.hangs import CpuSample, OsSample, StepTimeLearner
from monarch_ft.controller.integrity import IntegrityState
from monarch_ft.controller.ledger import CommitLedger
from monarch_ft.controller.placement import NodePool, Suspect
from monarch_ft.controller.snapshot import Tracked, live, note_changed, own
from monarch_ft.controller.standby_pool import StandbyPoolState
from monarch_ft.controller.stragglers import StragglerWatch
from monarch_ft.launcher.base import RankLaunch, RankProcess
from monarch_ft.records.events import GiveUpReason, GroupStatus, JobStatus, StrEnum
from monarch_ft.records.integrity import INTEGRITY_ROLLBACK
from monarch_ft.records.reports import ReportTail

# The snapshot's version: a controller refuses (one line) to take over a job whose
# controller.json another version wrote. 2: the generic JobState snapshot; files of
# version 1 (fields listed by hand) do not load.
STATE_VERSION = 2


# ---------------------------------------------------------------- a group's status
# Every status a group may move to from each status. A failed group is STOPPED first (its
# ranks killed), then given its next step: WAITING for a relaunch, STARTING (a standby promoted
# in its place), GIVEN_UP. WAITING -> WAITING: a full restart reschedules a group already
# waiting. DONE and GIVEN_UP are final.
TRANSITIONS: dict[GroupStatus, frozenset[GroupStatus]] = {
    GroupStatus.WAITING: frozenset({GroupStatus.STARTING, GroupStatus.WAITING, GroupStatus.GIVEN_UP}),
    GroupStatus.STARTING: frozenset({GroupStatus.RUNNING, GroupStatus.STOPPED, GroupStatus.DONE}),
    GroupStatus.RUNNING: frozenset({GroupStatus.STOPPED, GroupStatus.DONE}),
    GroupStatus.STOPPED: frozenset({GroupStatus.WAITING, GroupStatus.STARTING, GroupStatus.GIVEN_UP}),
    GroupStatus.DONE: frozenset(),
    GroupStatus.GIVEN_UP: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A group status change the table does not allow: a bug in the loop, never a fault."""


def can_transition(src: GroupStatus, dst: GroupStatus) -> bool:
    return dst in TRANSITIONS[src]


# ---------------------------------------------------------------- failures
class FailureKind(StrEnum):
    """Why a group (or the job) failed, as the planner is told."""

    EXIT = "exit"  # a rank exited non-zero
    HUNG = "hung"  # a hang verdict (controller.hangs)
    LOST = "lost_while_unsupervised"  # a rank gone while no controller watched (found by a takeover)
    # Its ranks could not load the checkpoint they were told to (quarantined): not the
    # group's fault, so not charged to its restart budget.
    LOAD_FAILED = "load_failed"
    STALL = "job_stall"  # every stepping group stalled past ft.stall_timeout_s (the job, no group)
    # Silent data corruption (controller.integrity): the group's state fingerprint disagreed
    # with the majority of its peers' (it heals from them like any failed group), or it voted
    # against ft.suspect_vetoes commits in a row while its state agreed (its compute is bad).
    CORRUPT = "corrupt"
    SUSPECT = "suspect"
    # The replicas' fingerprints disagree with no majority (the job, no group): none is trusted.
    DIVERGED = INTEGRITY_ROLLBACK
    # ft.straggler=evict: the group is slow, not failed; the controller fails it so a ready
    # standby takes its place (RecoveryPlanner.on_straggler).
    STRAGGLER = "straggler"


@dataclass(frozen=True)
class Failure:
    """One failure to decide on.

    Args:
        kind: why.
        group: the failed group (None: the job as a whole, a stall).
        startup: the failed attempt's start-up failure (controller.budget.startup_failure): the
            crash-loop signature, compared with the group's previous one; None: it stepped, or
            failed otherwise.
        suspects: the nodes the failure implicates (controller.placement.node_suspicion: every
            rank on the node lost at once, or the scheduler counts it gone): none where the
            launcher has no nodes, or for a fault of the processes.
        at_most: ``DIVERGED``: the newest step the replicas agreed on (no state after it is trusted).
    """

    kind: FailureKind
    group: Optional[int] = None
    startup: Optional[dict] = None
    suspects: tuple[Suspect, ...] = ()
    at_most: Optional[int] = None

    @property
    def charged(self) -> bool:
        """It counts against the group's restart budget."""
        return self.kind is not FailureKind.LOAD_FAILED


# ---------------------------------------------------------------- a rank
@dataclass(frozen=True)
class LaunchRecord:
    """A rank's :class:`RankLaunch` as the job's state keeps it: all but its environment and
    launcher extras (the environment is the controller's own, and may hold secrets; a new
    controller needs neither to re-adopt the rank)."""

    group: int
    rank: int
    attempt: int
    argv: list[str]
    log_path: str
    cwd: str
    host: str = "localhost"
    die_with_controller: bool = False
    niceness: int = 0
    standby: Optional[int] = None

    # RankLaunch's fields a record leaves out (a test checks that the two classes agree).
    LEFT_OUT = ("env", "extra")

    @classmethod
    def of(cls, launch: RankLaunch) -> "LaunchRecord":
        fields = {f.name: getattr(launch, f.name) for f in dataclasses.fields(cls)}
        fields["argv"] = list(fields["argv"])  # its own copy: a record is never changed in place
        return cls(**fields)

    def launch(self) -> RankLaunch:
        return RankLaunch(env={}, extra={}, **dataclasses.asdict(self))


@dataclass
class RankState(Tracked):
    """One rank of a group (or of a standby), as the controller knows it. Its fields are set,
    never changed in place (:class:`~monarch_ft.controller.snapshot.Tracked`)."""

    # ---- who it is, and how a new controller finds it again
    launch: LaunchRecord
    # Its process identity (pid, start time) while it runs; None once it exited, or while not
    # known yet (a Slurm rank's pid, once its job runs). Mirrored from ``proc`` before a save.
    pid: Optional[int] = None
    start: Optional[str] = None
    # The report file's offset read so far (mirrored from ``tail`` before a save).
    report_offset: int = 0
    exited: Optional[int] = None
    # ---- what its reports said
    last_step: int = -1
    train_done: bool = False
    state_hash: Optional[str] = None
    first_step_seen: bool = False
    model_ready: bool = False
    # Its link probe server, ``host:port`` (model_ready's ``link_probe``; controller.link_probe), or None.
    link_probe: Optional[str] = None
    # The main thread's phase, from the rank's liveness beats (records.phases.Phase), and the
    # rank's own start time of it.
    phase: Optional[str] = None
    phase_since: float = 0.0
    # The exception that ended it, as it reported it (rank_error: records.reports.error_record), or None.
    error: Optional[dict] = None
    # ---- this controller's own watch: its clocks restart when a new controller attaches
    # (the time unwatched is not the rank's)
    last_progress: float = own(0.0)
    # When this controller first saw the current phase (the clock hangs are judged by).
    phase_seen: float = own(0.0)
    # Its OS state, sampled every tick, and since when it has held (controller.hangs.track_os_state).
    os_sample: Optional[OsSample] = own(None)
    # Its CPU seconds, sampled every tick: since when it has used next to none (controller.hangs.track_cpu).
    cpu_sample: Optional[CpuSample] = own(None)
    # ---- live handles: rebuilt by a takeover from launch, pid/start and report_offset
    proc: Optional[RankProcess] = live()
    tail: Optional[ReportTail] = live()

    @classmethod
    def launched(cls, proc: RankProcess, tail: ReportTail, now: float) -> "RankState":
        """A rank just launched (or promoted), watched from ``now``."""
        return cls(LaunchRecord.of(proc.launch), last_progress=now, proc=proc, tail=tail)

    @property
    def rank(self) -> int:
        return self.launch.rank

    def mirror(self, identity: Any) -> None:
        """Copy what the live handles know into the saved fields (before a snapshot):
        ``identity`` the process's :class:`~monarch_ft.common.process.ProcessIdentity` (None: not known)."""
        running = self.exited is None and identity is not None
        pid, start = (identity.pid, identity.start) if running else (None, None)
        # Set only what differs: a set is a change to save (snapshot.Tracked).
        if (self.pid, self.start) != (pid, start):
            self.pid, self.start = pid, start
        self.mirror_offset()

    def mirror_offset(self) -> None:
        """Copy the report tail's position into ``report_offset`` (all a running rank whose
        identity is mirrored needs before a snapshot: its identity holds while it runs)."""
        if self.tail is not None and self.report_offset != self.tail.position:
            self.report_offset = self.tail.position


# ---------------------------------------------------------------- a group
@dataclass(frozen=True)
class LaunchPlan:
    """How a group's next attempt starts: set where its launch is scheduled (the job's start or
    resume, a relaunch after a failure, a full restart), read once, at its launch.

    Args:
        at: not before this time (the relaunch's backoff).
        load_step: the checkpoint step the attempt loads before it reports ``model_ready``: -1 the
            latest (``checkpoint.resume``), N that step (a full restart), None nothing (it heals from
            a peer, or starts afresh).
        load_path: the verified step directory it loads ``load_step`` from (None: its own folder's copy).
        start_gate: the shared start gate it waits at before its first step (the job's start, a
            full restart); "" for a live relaunch, which waits at a launch gate of its own.
    """

    at: float = 0.0
    load_step: Optional[int] = None
    load_path: Optional[str] = None
    start_gate: str = ""


@dataclass
class GroupState(Tracked):
    """One replica group. Its status changes through :meth:`move` only; its other fields are
    set, never changed in place (``g.ranks = [...]``, not ``g.ranks.append``): the takeover
    save writes what was set (:class:`~monarch_ft.controller.snapshot.Tracked`)."""

    index: int
    status: GroupStatus = GroupStatus.WAITING
    # ---- its attempts
    attempt: int = -1
    restarts: int = 0
    launched_at: float = 0.0
    ranks: list[RankState] = field(default_factory=list)
    # How its next attempt starts (LaunchPlan): the one place a scheduled launch is described.
    plan: LaunchPlan = field(default_factory=LaunchPlan)
    # Its failure, stopped and not yet answered (status STOPPED: the facts its recovery needs are
    # being found), or None.
    failure: Optional[Failure] = None
    # ---- its progress
    last_step: int = -1
    train_done: bool = False
    first_loss: Optional[float] = None
    last_loss: Optional[float] = None
    # ---- where the current attempt's state comes from
    # The gate its ranks wait at before their first step: a shared start gate (first launch,
    # full restart) or its own launch gate (a live relaunch).
    gate: str = ""
    # Its own launch gate was opened (the decision on its state source is written).
    gate_decided: bool = False
    # The disk checkpoint this attempt was told to load (step, step directory), and its
    # ranks' checkpoint_load_failed report if the load raised.
    loading: Optional[tuple[int, str]] = None
    load_failure: Optional[dict] = None
    # ---- its restart budget and crash-loop rule (controller.budget)
    # When it was relaunched, within the restart budget's window (controller.budget.recent_restarts).
    restart_times: list[float] = field(default_factory=list)
    # How its latest attempt failed at start-up (controller.budget.startup_failure), None if it
    # stepped or failed otherwise: the next attempt failing the same way is a crash loop.
    startup_failure: Optional[dict] = None
    # Its latest failure's error, as its ranks reported it (None: none reported; killed, hung).
    last_error: Optional[dict] = None
    # Why it was given up, None while it is not.
    gave_up: Optional[GiveUpReason] = None

    def __setattr__(self, name: str, value: Any) -> None:
        # The status is set once by the constructor (or a restore), then by move() only.
        if name == "status" and "status" in self.__dict__:
            raise IllegalTransition(f"group {self.index}: set its status with move(), not directly")
        super().__setattr__(name, value)

    def move(self, status: GroupStatus) -> None:
        """Change the status; raises :class:`IllegalTransition` for one :data:`TRANSITIONS` refuses."""
        if not can_transition(self.status, status):
            raise IllegalTransition(f"group {self.index}: {self.status} -> {status} is not an allowed transition")
        self.__dict__["status"] = GroupStatus(status)
        note_changed(self, "status")

    @property
    def active(self) -> bool:
        return self.status in (GroupStatus.STARTING, GroupStatus.RUNNING)

    @property
    def finished(self) -> bool:
        """Done or given up: nothing more happens to it."""
        return self.status in (GroupStatus.DONE, GroupStatus.GIVEN_UP)

    def error(self) -> Optional[dict]:
        """The earliest error a rank of the current attempt reported (the others often fail
        because of that one), or None."""
        errors = [rs.error for rs in self.ranks if rs.error]
        return min(errors, key=lambda e: e.get("time") or 0.0) if errors else None

    def failing(self) -> bool:
        """A rank of the current attempt exited non-zero: the group is about to be failed
        (its other ranks stopped with it), so it holds the job's state for nobody."""
        return any(rs.exited for rs in self.ranks)

    def stepped(self) -> bool:
        """Some rank of the current attempt reported a step (or finished)."""
        return any(rs.first_step_seen or rs.train_done for rs in self.ranks)


# ---------------------------------------------------------------- the job's other parts
@dataclass
class PendingRestart:
    """A full restart decided (every group stopped), waiting for its checkpoint step: the
    group whose failure triggered it (None: the job's), why (``full_restart``, ``job_stall``,
    ``replicas_diverged``), whether it counts against the restart budget, and the newest step
    it may go back to (an integrity rollback's)."""

    failed_group: Optional[int]
    trigger: str
    charged: bool = True
    at_most: Optional[int] = None


@dataclass
class LighthouseOutage:
    """The Lighthouse was lost at ``lost``: the survivors' stall is measured from the newest
    commit before it (``last_commit``) to the first one after it."""

    lost: float
    last_commit: Optional[float]
    job_step: int


@dataclass
class LighthouseState:
    """The job's Lighthouse: its address, the epoch of its restarts (the ranks' quorum ids move
    to a new range at each), and the processes a new controller adopts (mirrored before a save)."""

    address: str = ""
    port: int = 0
    epoch: int = 0
    guard_pid: Optional[int] = None
    guard_start: Optional[str] = None
    server_pid: Optional[int] = None
    server_start: Optional[str] = None
    outage: Optional[LighthouseOutage] = None


@dataclass
class WatchCost:
    """What the watch loop costs this controller process: its ticks, and its own CPU seconds
    and wall seconds while the loop ran (from :meth:`start` to the last :meth:`tick`).

    Why: the controller is one process for the whole job, and it does some work per group
    every tick (reading each rank's report, judging hangs, saving the job's state). Its CPU
    seconds per tick, against the number of groups, say whether it keeps up as the job grows
    (``benchmarks/scale_bench.py``); summary.json's ``controller.watch_loop`` carries them
    (:func:`monarch_ft.controller.summary.job_summary`).
    The CPU seconds are the whole process's (``time.process_time``: its threads too, the
    hooks a drill runs each tick included). After a takeover they are the last controller's.
    """

    ticks: int = 0
    cpu_start: Optional[float] = None
    wall_start: Optional[float] = None
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def start(self, now: float) -> None:
        """The loop begins at ``now`` (the loop's clock)."""
        self.cpu_start, self.wall_start = time.process_time(), now

    def tick(self, now: float) -> None:
        """One more tick, ended at ``now``."""
        if self.cpu_start is None or self.wall_start is None:
            self.start(now)
        self.ticks += 1
        self.cpu_s = time.process_time() - (self.cpu_start or 0.0)
        self.wall_s = now - (self.wall_start or now)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "cpu_s": round(self.cpu_s, 3),
            "cpu_s_per_tick": round(self.cpu_s / self.ticks, 6) if self.ticks else None,
            "wall_s": round(self.wall_s, 3),
        }


@dataclass
class WatchState:
    """This controller's own loop: never carried over (a new controller starts its own)."""

    # Why the job's state is gone (the loop ends the job FAILED at its next tick), or None.
    fatal: Optional[str] = None
    # A signal asked the loop to stop the job (its name), or None.
    stop_reason: Optional[str] = None
    last_tick: float = 0.0
    # Windows in which this controller itself was held up (silence there is not the ranks').
    blind: list[tuple[float, float]] = field(default_factory=list)
    last_progress_print: float = 0.0
    # Save failures' errnos already printed (one console line per kind).
    printed_save_failures: set[Optional[str]] = field(default_factory=set)
    # The job step last written to control/commit_floor.
    floor_written: int = -1
    # The transport peers last written for the ranks (RunLayout.transport_peers), and what they
    # were made from: the running groups, and how many owners were known (JobState.transport_owner
    # only grows; owners_set counts its assignments).
    peers_published: Optional[dict] = None
    peers_made_from: Optional[tuple[tuple[int, ...], int]] = None
    owners_set: int = 0
    # When each group's first launch began to wait for its host's fork server.
    first_wait: dict[int, float] = field(default_factory=dict)
    # Each group's last hang verdict (when, its attempt, the verdict): what a group not sampled
    # this tick is judged on (controller.decide.failures.judge_group).
    hangs_seen: dict[int, tuple[float, int, Any]] = field(default_factory=dict)
    # When each group was last judged by the hang model.
    judged_at: dict[int, float] = field(default_factory=dict)
    # The CPU stragglers found at the last judgement (controller.decide.slow; None: not yet),
    # when it was made, and whether steps came in since.
    cpu_stragglers: Optional[list] = None
    stragglers_judged_at: float = 0.0
    steps_unjudged: bool = False
    # The state hashes of steps below this were pruned (controller.decide.reports._record_commit).
    hashes_pruned_below: int = -1
    # The shared start gate this controller opened last ("" : none yet).
    gate_opened: str = ""
    # Groups this controller found, on taking the job over, with ranks gone: group -> those ranks
    # (failed at its first tick, once their reports are read).
    lost_on_attach: dict[int, list[int]] = field(default_factory=dict)
    # Its ticks and its CPU seconds (summary.json's controller.watch_loop).
    cost: WatchCost = field(default_factory=WatchCost)


@dataclass
class JobState:
    """Everything the controller knows of the job, in groups."""

    # ---- the job
    run_dir: str = ""
    # The job's config (dataclasses.asdict of its JobConfig): a takeover runs the job's own.
    config: dict = field(default_factory=dict)
    status: JobStatus = JobStatus.RUNNING
    started: float = 0.0
    tokens_path: str = ""
    # ---- its replica groups, and the start gates they wait at
    groups: list[GroupState] = field(default_factory=list)
    # Full restarts so far (each has its own shared start gate), and when the current gate's
    # generation began.
    full_restarts: int = 0
    gate_since: float = 0.0
    # A full restart whose groups are stopped and whose checkpoint step is being found (None: none).
    restart_pending: Optional[PendingRestart] = None
    # ---- its committed steps (controller.ledger)
    ledger: CommitLedger = field(default_factory=CommitLedger)
    # Each time it went back to a disk checkpoint (no group held its state), each commit below
    # its committed step (a group trained on a stale state), each step a later quorum redid.
    rollbacks: list[dict] = field(default_factory=list)
    regressions: list[dict] = field(default_factory=list)
    steps_redone: list[dict] = field(default_factory=list)
    # Commits of recent steps per (step, rank index): quorum id -> (group, state hash)
    # (controller.ledger.redone_commit), and the (step, quorum) redos already reported.
    commit_hashes: dict[tuple[int, int], dict[int, tuple[int, str]]] = field(default_factory=dict)
    redone_seen: set[tuple[int, int]] = field(default_factory=set)
    # Recent committed state hashes: step -> {(group, rank): hash} (Supervisor.consistent_at).
    step_hashes: dict[int, dict[tuple[int, int], str]] = field(default_factory=dict)
    # The newest committed step of each group's rank 0: its record's COMMIT_FIELDS
    # (controller.decide.reports; hooks such as chaos read it).
    last_commit: dict[int, dict] = field(default_factory=dict)
    # The newest quorum's participating groups, and which (group, rank) owns each transport
    # address (a healing rank names its peer by address only).
    membership: Optional[tuple[int, ...]] = None
    transport_owner: dict[Optional[str], tuple[int, int]] = field(default_factory=dict)
    first_step_time: Optional[float] = None
    # ---- hangs and stalls (controller.hangs)
    step_times: StepTimeLearner = field(default_factory=StepTimeLearner)
    # Since when every stepping group has been stalled (None: no job-wide stall), and until
    # when groups just out of one get a grace period.
    stall_since: Optional[float] = None
    stall_grace_until: float = 0.0
    # ---- fail-slow groups (controller.stragglers): the step times compared (this controller's
    # own: a new one relearns them over one window), and the hosts (by address) left out of
    # placements, with why
    stragglers: StragglerWatch = own(default_factory=StragglerWatch)
    excluded_hosts: dict[str, str] = field(default_factory=dict)
    # ---- the Lighthouse
    lighthouse: LighthouseState = field(default_factory=LighthouseState)
    # ---- disk checkpoints (controller.checkpoints)
    # Steps that failed to load in this job (step -> why): never chosen again.
    unloadable: dict[int, str] = field(default_factory=dict)
    # The last recovery's result (which copy each group loads).
    recovered: Optional[Recovered] = None
    # Failed saves and loads, quarantined copies, the newest good checkpoint: read off the
    # job's events, so a new controller rebuilds it from events.jsonl.
    ckpt_health: CheckpointHealth = own(default_factory=CheckpointHealth)
    # Recent verifications (records.manifest.verify_step_cached): a cache.
    verified: dict = own(default_factory=dict)
    # ---- silent data corruption (controller.integrity): the fingerprint rounds, the steps
    # the replicas agreed on (they vouch for checkpoints), condemned attempts, veto streaks
    integrity: IntegrityState = field(default_factory=IntegrityState)
    # ---- standbys and fork servers (their live processes are this controller's own)
    standby: StandbyPoolState = field(default_factory=StandbyPoolState)
    forks: ForkPoolState = field(default_factory=ForkPoolState)
    # ---- a cluster's nodes (launcher=slurm): the scheduler's view, the nodes kept out and why
    # (controller.placement; kept on takeover, and applied again)
    nodes: NodePool = field(default_factory=NodePool)
    # ---- the launcher's own handles on the ranks (Slurm job ids), mirrored before a save
    launcher_handles: dict = field(default_factory=dict)
    # ---- its controllers
    # A ``stop`` request was seen (its finish_requested is written once).
    stop_seen: bool = False
    # Why the job ended with no controller (close-out), or None.
    ended_by: Optional[str] = None
    # ---- this controller's own loop
    watch: WatchState = own(default_factory=WatchState)

    @classmethod
    def new(cls, groups: int, run_dir: str, config: dict, start_gate: str) -> "JobState":
        """A job about to start: ``groups`` groups waiting at the first shared ``start_gate``."""
        return cls(run_dir=run_dir, config=config, groups=[GroupState(i, plan=LaunchPlan(start_gate=start_gate)) for i in range(groups)])

    @property
    def job_step(self) -> int:
        """The job's committed steps (controller.ledger.CommitLedger)."""
        return self.ledger.job_step

    def live_peers(self, group: Optional[int]) -> tuple[int, ...]:
        """Groups other than ``group`` stepping in the job now (they hold its state). Every failure
        of a tick is judged (its group stopped) before any recovery is planned; a group with a rank
        exited non-zero is left out all the same (:meth:`GroupState.failing`): it holds the job's
        state for nobody, whatever the order of the decisions."""
        return tuple(g.index for g in self.groups if g.index != group and g.status == GroupStatus.RUNNING and not g.failing())

    def all_finished(self) -> bool:
        return all(g.finished for g in self.groups)
