"""The hang model: from what the controller sees of a group's live ranks, is one of them hung,
and which one to blame.

Pure decisions, kept apart from the watch loop (:mod:`monarch_ft.controller.loop`, which
samples the ranks and applies the verdicts) so each rule is unit-tested in milliseconds
against plain values. A rank is judged by its reports (silence, its :class:`Phase` and how
long it has been in it), its OS state held over time (:func:`track_os_state`) and its CPU use
(:func:`track_cpu`); the limits are :class:`HangLimits`, with ``ft.hang_timeout_s=auto``
learned from the step times (:class:`StepTimeLearner`, :func:`auto_hang_timeout`). Every
stepping group hung at once is one job-wide stall (:func:`is_job_stall`), not N faults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from monarch_ft.records.events import StrEnum
from monarch_ft.records.phases import Phase
from monarch_ft.records.reports import compute_seconds
from monarch_ft.records.stats import percentile


class OsState(StrEnum):
    """psutil's process states that matter to hang blame."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    DISK_SLEEP = "disk-sleep"
    STOPPED = "stopped"
    TRACING_STOP = "tracing-stop"
    ZOMBIE = "zombie"
    DEAD = "dead"
    GONE = "gone"


# A rank in one of these states is stuck by itself (SIGSTOP, dead); a rank merely sleeping
# may be waiting on a peer in a collective. Not disk-sleep: a rank passes through it on any
# file write, so one sample of it explains nothing (a CI run failed a stall's only group on
# such a sample); telling a rank stuck in I/O needs the state held for a while (OS_STALL_STATES).
SELF_EXPLAINED = {OsState.STOPPED.value, OsState.TRACING_STOP.value, OsState.ZOMBIE.value, OsState.DEAD.value}

# Held for ``ft.os_stall_s`` without a break, one of these makes a rank hung at once, without
# waiting for any timeout: SIGSTOPped, dead but not reaped, or stuck in uninterruptible I/O.
# Not tracing-stop: that is a debugger's or py-spy's own ptrace stop (a stacks capture).
OS_STALL_STATES = {OsState.STOPPED.value, OsState.ZOMBIE.value, OsState.DEAD.value, OsState.DISK_SLEEP.value}


# Phases whose work is disk I/O (imports and model files, checkpoint writes): a long
# disk-sleep there is slow storage within the phase's own budget, not an OS stall.
IO_PHASES = {Phase.STARTUP.value, Phase.SAVE.value, None}


@dataclass(frozen=True)
class OsSample:
    """One rank's OS state and since when it has been seen in it without a break."""

    state: Optional[str]
    since: float
    seen: float

    @property
    def held_s(self) -> float:
        return self.seen - self.since


def track_os_state(prev: Optional[OsSample], state: Optional[str], now: float, max_gap_s: float) -> OsSample:
    """The rank's state sampled at ``now``, continuing ``prev`` if it is the same state and the
    previous sample is recent: a state counts as held only if every sample in between saw it
    (a supervisor that did not look for ``max_gap_s`` does not know what happened meanwhile)."""
    if prev is not None and prev.state == state and now - prev.seen <= max_gap_s:
        return OsSample(state, prev.since, now)
    return OsSample(state, now, now)


# A process that used at most this much CPU (seconds: a few clock ticks of 10 ms, the
# kernel's resolution, plus this share of one core over the spell) is asleep: its liveness
# thread's beats and TorchFT's heartbeats cost a fraction of that; a rank that computes,
# even starved on a loaded machine, uses far more.
ASLEEP_CPU_BASE_S = 0.03
ASLEEP_CPU_SHARE = 0.05


@dataclass(frozen=True)
class CpuSample:
    """Since when a rank's process has used next to no CPU (an asleep spell), from its CPU
    seconds (every thread's user + system time) sampled every tick."""

    cpu_s: float  # its CPU seconds at ``since``
    since: float  # the sample that last saw it working: the spell's start
    seen: float

    @property
    def asleep_s(self) -> float:
        return self.seen - self.since


def track_cpu(prev: Optional[CpuSample], cpu_s: Optional[float], now: float) -> Optional[CpuSample]:
    """The rank's CPU seconds sampled at ``now``: the asleep spell goes on while it used at
    most ``ASLEEP_CPU_BASE_S + ASLEEP_CPU_SHARE`` x the spell's length, and starts over at a
    sample that saw more. CPU time is a counter, so samples the supervisor missed lose
    nothing (unlike an OS state, which must be seen at every sample). None: not readable."""
    if cpu_s is None:
        return None
    if prev is None or cpu_s - prev.cpu_s > ASLEEP_CPU_BASE_S + ASLEEP_CPU_SHARE * (now - prev.since):
        return CpuSample(cpu_s, now, now)
    return CpuSample(prev.cpu_s, prev.since, now)


class BlameReason(StrEnum):
    """Why a rank of a hung group is the one to blame, strongest first."""

    OS_STALL = "os_stall"  # stopped, zombie or in disk-sleep for ft.os_stall_s without a break
    OS_STATE = "os_state"  # stopped or traced right now (not yet for os_stall_s)
    # Asleep (next to no CPU, its main thread sleeping) and silent for ft.asleep_s while ranks
    # elsewhere beat: a thread holds the GIL while it waits (nothing of it runs Python).
    FROZEN = "frozen"
    # Asleep in compute for ft.asleep_s (or a few learned compute times) with its whole group
    # asleep too, every rank beating, and in its phase the longest: nothing of the group runs,
    # and the rest of it waits for this rank (a collective it never joined).
    ASLEEP = "asleep"
    SILENT = "silent"  # its liveness thread is frozen (stopped, or the GIL held) while peers beat
    PHASE = "phase"  # past its phase's budget, still beating (stuck computing, or waiting)


_BLAME_ORDER = list(BlameReason)


@dataclass(frozen=True)
class RankView:
    """What the supervisor knows of one live rank at a tick."""

    rank: int
    silent_s: float  # since its last record of any kind (a step, an event, a liveness beat)
    started: bool  # it has stepped (or finished): startup limits no longer apply
    phase: Optional[str] = None  # its last reported Phase
    phase_s: float = 0.0  # how long it has been in that phase
    os_state: Optional[str] = None
    os_state_s: float = 0.0  # how long os_state has been seen without a break (OsSample.held_s)
    finished: bool = False  # it reported train_done: it is on its way out
    asleep_s: Optional[float] = None  # how long its process has used next to no CPU (CpuSample); None: unknown


@dataclass(frozen=True)
class HangLimits:
    """How long each thing may take before a rank counts as hung.

    Args:
        hang_timeout_s: a rank that reports nothing at all (its liveness thread cannot run:
            stopped, or the GIL held) for this long is hung; so is one computing this long.
            With ``ft.hang_timeout_s=auto`` the supervisor passes the learned value
            (:func:`auto_hang_timeout`).
        startup_timeout_s: the same for a rank that has not stepped yet (imports, model build).
        save_timeout_s: the rank-side save watchdog's bound; a save gets this plus a margin.
        sync_budget_s: TorchFT's own bound on a quorum plus a collective and a commit
            (``ft.sync_budget_s``: quorum_timeout + timeout + the vote's 2 x timeout): a rank waiting in TorchFT for a slow peer is not
            hung before TorchFT itself gives up.
        os_stall_s: ``ft.os_stall_s``: a rank stopped, a zombie, or in disk-sleep (outside
            its I/O phases) this long without a break is hung at once.
        suspect_silence_s: once its group is hung, a rank silent this long (a few missed
            liveness beats) is blamed before peers that still beat: they wait for it.
        asleep_s: ``ft.asleep_s``: a stepping rank whose process has been asleep this long
            (its main thread sleeping at every sample, next to no CPU) is hung when it is
            also silent while ranks elsewhere beat (:attr:`BlameReason.FROZEN`).
        asleep_compute_s: the same for a rank asleep in compute with its whole group asleep
            (:attr:`BlameReason.ASLEEP`): ``asleep_s``, or a few learned compute times where
            steps are long (:func:`asleep_compute_timeout`). None: that rule is off.
    """

    hang_timeout_s: float
    startup_timeout_s: float
    save_timeout_s: float
    sync_budget_s: float
    os_stall_s: float = 0.5
    suspect_silence_s: float = 0.75
    asleep_s: Optional[float] = None
    asleep_compute_s: Optional[float] = None

    def silent_limit(self, r: RankView) -> float:
        """How long ``r`` may go without a record. In a checkpoint save, as long as the save
        may take (its phase budget): pickling a state dict holds the GIL and the writes wait on
        the disk, so the liveness thread beats late, and every group saves at the same step. On
        2 cores, 4 groups saving at once left healthy ranks silent 3.0-3.6 s, and the 3 s hang
        timeout failed them; 16 groups more often (benchmarks/scale_bench.py). A rank frozen in a
        save is still told at once by :meth:`frozen`; one stuck there by :meth:`phase_budget`."""
        if not r.started:
            return self.startup_timeout_s
        if r.phase == Phase.SAVE.value:
            return max(self.hang_timeout_s, self.phase_budget(r.phase))
        return self.hang_timeout_s

    def phase_budget(self, phase: Optional[str]) -> float:
        if phase == Phase.COMPUTE.value:
            return self.hang_timeout_s
        if phase == Phase.SYNC.value:
            return self.sync_budget_s + self.hang_timeout_s
        if phase == Phase.SAVE.value:
            return self.save_timeout_s + self.hang_timeout_s / 2
        if phase == Phase.STARTUP.value:
            return self.startup_timeout_s
        return float("inf")  # gate, hold: the supervisor itself releases them

    def overdue(self, r: RankView) -> bool:
        return r.silent_s > self.silent_limit(r) or r.phase_s > self.phase_budget(r.phase)

    def os_stalled(self, r: RankView) -> bool:
        """Stopped, zombie or in disk-sleep for ``os_stall_s`` without a break. Ranks pass
        through disk-sleep on every file write, so only a held state counts, and not in the
        phases whose work is I/O (startup, save: their own budgets apply)."""
        if r.os_state not in OS_STALL_STATES or r.os_state_s < self.os_stall_s:
            return False
        if r.os_state == OsState.ZOMBIE.value and r.finished:
            # Its main thread has exited and the other threads are still going down (a
            # multi-threaded exit, a core dump): the exit status is coming, not a hang.
            return False
        return not (r.os_state == OsState.DISK_SLEEP.value and r.phase in IO_PHASES)

    def asleep(self, r: RankView, seconds: Optional[float]) -> bool:
        """``r`` has stepped, and for ``seconds`` its process used next to no CPU while its main
        thread was seen sleeping at every sample. Both, because each alone misleads: a rank
        computing on a loaded machine may get little CPU but is runnable, not sleeping; a rank
        waiting in a collective sleeps between samples yet its peers' work wakes it. Not in
        startup (imports, a model build: its own budget), nor once it is on its way out. A
        save counts: its writes use CPU or wait in disk-sleep (healthy ranks were seen silent
        for 3.4 s in a save on a machine at load 30), never asleep with every thread stopped."""
        return (
            seconds is not None
            and r.started
            and not r.finished
            and r.phase not in (Phase.STARTUP.value, None)
            and r.asleep_s is not None
            and r.asleep_s >= seconds
            and r.os_state == OsState.SLEEPING.value
            and r.os_state_s >= seconds
        )

    def frozen(self, r: RankView, others_beating: bool) -> bool:
        """Asleep and silent for ``asleep_s`` while ranks elsewhere still beat.

        Its liveness thread cannot have been waiting for CPU (the process is asleep, not
        runnable) nor for its main thread's waits (TorchFT and collectives release the GIL):
        a thread holds the GIL while it sleeps. Only with ranks elsewhere beating: if nobody
        beats, the cause is shared (a stalled filesystem, the whole machine), not this rank."""
        return others_beating and self.asleep(r, self.asleep_s) and r.silent_s >= (self.asleep_s or 0.0)

    def asleep_in_compute(self, ranks: Sequence[RankView]) -> Optional[RankView]:
        """The rank stuck asleep in compute, if its whole group is asleep with it; else None.

        On a CPU, computing is CPU work: a rank in compute for ``asleep_compute_s`` using none
        is not computing. It may be waiting in one of its group's collectives, so the rule
        needs the whole group asleep (a slow peer that still computes uses CPU), every rank
        beating (a silent one is :meth:`frozen`'s), and this rank the longest in its phase:
        a group waiting in TorchFT for another group (a quorum, a heal from a hung peer) has
        its waiting rank in sync since before the others entered compute (TorchFT's quorum and
        commit vote wait for every rank of the group), so the blame stays with that wait and
        its own budget, never with a survivor.
        """
        live = [r for r in ranks if not r.finished]
        if self.asleep_compute_s is None or not live:
            return None
        if not all(self.asleep(r, self.asleep_s) and r.silent_s < self.suspect_silence_s for r in live):
            return None
        oldest = max(live, key=lambda r: r.phase_s)
        if oldest.phase == Phase.COMPUTE.value and oldest.phase_s >= self.asleep_compute_s and self.asleep(oldest, self.asleep_compute_s):
            return oldest
        return None

    def blame(self, r: RankView) -> Optional[BlameReason]:
        """Why ``r`` would be blamed if its group is hung (None: nothing points at it)."""
        if self.os_stalled(r):
            return BlameReason.OS_STALL
        if r.os_state in SELF_EXPLAINED:
            return BlameReason.OS_STATE
        if r.silent_s >= self.suspect_silence_s:
            return BlameReason.SILENT
        if self.overdue(r):
            return BlameReason.PHASE
        return None


@dataclass(frozen=True)
class Hang:
    rank: int
    silent_s: float
    os_state: Optional[str]
    # The culprit's state explains the silence (stopped, zombie, ...), not a wait on a peer.
    self_explained: bool
    phase: Optional[str]
    phase_s: float
    reason: Optional[str] = None  # BlameReason
    # Every live rank's OS state at the verdict (rank -> psutil state), sampled once.
    rank_states: dict = field(default_factory=dict)
    os_state_s: float = 0.0
    asleep_s: Optional[float] = None  # the culprit's asleep spell (CpuSample), None: unknown


# Verdicts that point at the culprit itself, not merely at a rank past a time limit: its OS
# state, or frozen while ranks elsewhere beat (a job-wide cause is excluded by the rule itself).
# Not ASLEEP: a group asleep in compute may be every group of the job stuck at once (the last
# group holding its state), which is_job_stall waits out rather than killing it.
_SELF_EXPLAINED = (BlameReason.OS_STALL, BlameReason.OS_STATE, BlameReason.FROZEN)


def find_hang(ranks: Sequence[RankView], limits: HangLimits, others_beating: bool = False) -> Optional[Hang]:
    """The rank to blame when some rank of a group is hung, else None.

    A group is hung when a rank is OS-stalled (hung at once), frozen or asleep in compute
    (hung after ``asleep_s``: see :meth:`HangLimits.frozen`, :meth:`HangLimits.asleep_in_compute`),
    or past its limit (silence, phase budget). One stuck rank soon stalls its group peers too
    (they wait in its collectives, inside their own budgets, or even past them): so blame,
    among all ranks, one whose OS state explains it, then one frozen (asleep and silent while
    its peers beat: sleeping with the GIL held, which from outside looks like the peers'
    state), then the one asleep in compute that its group waits for, then one merely silent,
    then the one longest in its phase.

    Args:
        ranks: the group's live ranks.
        limits: the bounds (HangLimits).
        others_beating: some rank outside this group reported within the last
            ``suspect_silence_s``: a rank of this group silent and asleep is frozen by itself.
    """
    frozen = {r.rank for r in ranks if limits.frozen(r, others_beating or any(p.silent_s < limits.suspect_silence_s for p in ranks if p is not r))}
    stuck = limits.asleep_in_compute(ranks)
    if not frozen and stuck is None and not any(limits.os_stalled(r) or limits.overdue(r) for r in ranks):
        return None

    def reason_of(r: RankView) -> Optional[BlameReason]:
        b = limits.blame(r)
        if b in (BlameReason.OS_STALL, BlameReason.OS_STATE):
            return b
        if r.rank in frozen:
            return BlameReason.FROZEN
        if stuck is not None and r.rank == stuck.rank:
            return BlameReason.ASLEEP
        return b

    blamed = [(r, b) for r in ranks if (b := reason_of(r)) is not None]
    culprit, reason = min(blamed, key=lambda rb: (_BLAME_ORDER.index(rb[1]), -rb[0].silent_s, -rb[0].phase_s))
    return Hang(
        rank=culprit.rank,
        silent_s=round(culprit.silent_s, 2),
        os_state=culprit.os_state,
        self_explained=reason in _SELF_EXPLAINED,
        phase=culprit.phase,
        phase_s=round(culprit.phase_s, 2),
        reason=reason.value,
        rank_states={r.rank: r.os_state for r in ranks},
        os_state_s=round(culprit.os_state_s, 2),
        asleep_s=None if culprit.asleep_s is None else round(culprit.asleep_s, 2),
    )


# On a GPU the asleep-in-compute bound is at least this many learned compute times: the
# host thread may block without spinning while the device computes a long step.
ASLEEP_STEP_FACTOR = 4.0


def asleep_compute_timeout(compute_p99_s: Optional[float], asleep_s: float, on_cpu: bool) -> float:
    """How long a rank may be asleep in compute.

    On a CPU, ``ft.asleep_s``: computing is CPU work there, so no step time, however long
    (the learned one grows tenfold on a loaded machine, and learns the hung step itself),
    excuses a process that uses none. On a GPU, max(``asleep_s``, ASLEEP_STEP_FACTOR x the
    learned p99 compute seconds), ``asleep_s`` before any step was learned.

    Args:
        compute_p99_s: StepTimeLearner.p99(), None before any step.
        asleep_s: ``ft.asleep_s``.
        on_cpu: the ranks compute on the CPU (``training.device``).
    """
    if on_cpu or compute_p99_s is None:
        return asleep_s
    return max(asleep_s, ASLEEP_STEP_FACTOR * compute_p99_s)


# ---------------------------------------------------------------- ft.hang_timeout_s=auto
def auto_hang_timeout(compute_s: Sequence[float], min_s: float, factor: float, fallback_s: float) -> float:
    """The learned hang timeout: max(``min_s``, ``factor`` x p99 of the recent compute times).

    Args:
        compute_s: recent seconds of a step's own work (forward, backward, optimizer:
            the step time less its quorum and cross-group sync, which have their own
            budget), across ranks; the supervisor keeps the last :data:`AUTO_WINDOW`.
        min_s: ``ft.hang_min_s``: the floor, above a few missed liveness beats.
        factor: ``ft.hang_step_factor`` (k).
        fallback_s: the timeout before :data:`AUTO_MIN_SAMPLES` steps were seen.
    """
    if len(compute_s) < AUTO_MIN_SAMPLES:
        return max(min_s, fallback_s)
    return max(min_s, factor * percentile(compute_s, 99))


# Step times the auto timeout learns from (job-wide, every rank's; a step record each) and
# how many it needs before it trusts them.
AUTO_WINDOW = 200
AUTO_MIN_SAMPLES = 4


@dataclass
class StepTimeLearner:
    """Recent compute seconds per step, for :func:`auto_hang_timeout`.

    A rank attempt's first step is left out (it carries lazy initialisation and the first
    quorum), and so are sync seconds: a survivor's step that waited ~1 s for the Lighthouse
    to drop a failed group says nothing about how long computing takes. Part of the job's
    state (a controller taking the job over keeps the learned timeout).
    """

    window: int = AUTO_WINDOW
    # The newest ``window`` compute times, oldest first.
    samples: list[float] = field(default_factory=list)
    # (group, rank, attempt) whose first step was seen (and left out).
    seen: set[tuple[Optional[int], Optional[int], Optional[int]]] = field(default_factory=set)

    def observe(self, rec: dict) -> None:
        """Take one step record (``step_time_s``, ``quorum_s``, ``xgroup_s``, group/rank/attempt)."""
        key = (rec.get("group"), rec.get("rank"), rec.get("attempt"))
        if key not in self.seen:
            self.seen.add(key)
            return
        if rec.get("step_time_s") is None:
            return
        self.samples.append(compute_seconds(rec))
        del self.samples[: -self.window]

    def p99(self) -> Optional[float]:
        return percentile(list(self.samples), 99) if self.samples else None

    def median(self) -> Optional[float]:
        return percentile(list(self.samples), 50) if self.samples else None


def is_job_stall(hung: dict[int, Hang], stepping: Sequence[int]) -> bool:
    """Every group that was stepping looks hung and none is stuck by itself.

    That is one job-wide stall (a shared cause: CPU starvation, a shared service, a
    collective across groups), not N rank faults: killing them all would leave the job
    with no group holding its state, by the detector's own hand.

    Args:
        hung: this tick's hang verdicts, by group.
        stepping: groups that were stepping in the job (running, not given up).
    """
    if not hung or not stepping:
        return False
    if any(h.self_explained for h in hung.values()):
        return False
    return all(g in hung for g in stepping)
