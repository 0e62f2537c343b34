"""Warm standby groups: ranks built ahead of a fault that take a failed group's place.

Most of a cold restart's MTTR is a new rank starting: a Python interpreter, importing
torch/TorchTitan/TorchFT, building and sharding the model. A standby group (``ft.standby_groups``,
M ranks like any group) does all of that once, early, and then waits: its own store and
in-group process group, the model built and sharded, optimizer state materialised, data
opened, the cross-group process group and checkpoint transport ready. What it must NOT do
before it is promoted is construct the TorchFT Manager: a Manager heartbeats the
Lighthouse from construction on, and a heartbeating replica that never asks for a
quorum holds every quorum up to the join timeout (and counts against the split-brain
rule of torchft's ``quorum_compute``). So the Manager and everything tied to a group's
identity (report files, scratch, checkpoint folder, data shard, fault agent) is built
on promotion (trainer.Trainer._bind).

The supervisor promotes a ready standby when a group fails (exit, hang verdict, node
fault): it writes one promotion file (RunLayout.promotion, atomically) that carries the
identity the standby takes and where the group's state comes from, decided exactly as a
relaunched group's launch gate decides it (recovery.decide_state_source: a live peer,
else the newest disk checkpoint, else the job's state is lost). Then it builds a
replacement standby in the background at a lower CPU priority than the training ranks.
With no standby ready (two faults close together) the cold path runs.

This module holds the pure decisions (unit-tested in tests/test_standby.py), the
supervisor's pool bookkeeping, and the rank's side of a promotion.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from monarch_ft.records.events import EventKind, RecoveryPath, StandbyStatus
from monarch_ft.records.decisions import Promotion

# Niceness of a standby while it builds and waits: below the training ranks (0), so a
# standby being (re)built in the background does not slow the job it protects.
STANDBY_NICENESS = 10
# How often a waiting standby rank looks for its promotion file: one stat() per poll,
# well under 0.1% of a core, and at most this much added to a recovery.
PROMOTION_POLL_S = 0.02
# OS states (psutil) in which a standby cannot take over: it is not promoted, it is replaced.
DEAD_STATES = ("stopped", "zombie", "dead", "gone", "tracing-stop")


# ---------------------------------------------------------------- pure decisions
def resolve_standby_groups(configured: Optional[int], launcher_default: int, recovery: str) -> int:
    """How many standby groups the job keeps.

    Args:
        configured: ``ft.standby_groups`` (None: the launcher's default).
        launcher_default: the launcher's ``LauncherTraits.default_standby_groups``: 1 where a
            standby costs only local processes, 0 where it holds a real allocation (its own
            Slurm job or Monarch proc mesh: K > 0 is then the user's explicit choice).
        recovery: ``ft.recovery``; ``full_restart`` (the baseline) uses none.
    """
    if recovery == "full_restart":
        return 0
    if configured is None:
        return launcher_default
    return configured


def standby_config_error(configured: Optional[int], launcher: str) -> Optional[str]:
    """One line naming the fix for an ``ft.standby_groups`` that cannot run, else None."""
    if configured is None:
        return None
    if configured < 0:
        return f"ft.standby_groups={configured}: must be >= 0 (0 disables warm standby groups)"
    return None


def check_standby_config(cfg: Any) -> None:
    """config.validate's check (raises ConfigError: one line, exit 2, before anything runs)."""
    from monarch_ft.records.errors import ConfigError

    error = standby_config_error(cfg.ft.standby_groups, cfg.launcher.name)
    if error:
        raise ConfigError(error)


# Standbys lost in a row while still building (a crash at start-up, not a fault while
# waiting) after which the job stops building them: a build that always fails would
# otherwise start processes on every watch tick.
MAX_FAILED_BUILDS = 3


def standbys_to_launch(wanted: int, alive: int, training_started: bool, job_finishing: bool, failed_builds: int = 0) -> int:
    """How many standbys to start now: none before the training groups are up (a standby
    must not slow the job's first start), once every group is done, or after
    MAX_FAILED_BUILDS builds in a row failed; else the shortfall."""
    if not training_started or job_finishing or failed_builds >= MAX_FAILED_BUILDS:
        return 0
    return max(0, wanted - alive)


def standby_loss(exit_codes: Sequence[Optional[int]], os_states: Sequence[Optional[str]] = ()) -> Optional[str]:
    """Why a standby can no longer take over (a rank exited, or is stopped or a zombie), or None.

    Args:
        exit_codes: each rank's exit code, None while it runs.
        os_states: each rank's psutil state where known (checked before a promotion).
    """
    for rank, code in enumerate(exit_codes):
        if code is not None:
            return f"rank {rank} exited ({code})"
    for rank, state in enumerate(os_states):
        if state in DEAD_STATES:
            return f"rank {rank} is {state}"
    return None


def recovery_path(recovery: str, standby_ready: bool) -> RecoveryPath:
    """How a failed group comes back: a ready standby takes its place (live recovery only),
    else its ranks start cold."""
    if recovery != "full_restart" and standby_ready:
        return RecoveryPath.STANDBY
    return RecoveryPath.COLD_START


class UnreadyClock:
    """Seconds the job ran without a ready standby (counted from when it first wanted one).

    Args:
        wanted: standby groups configured (0: the clock never runs).
    """

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.total = 0.0
        self.spells = 0  # times the job went from covered to uncovered
        self._since: Optional[float] = None

    def update(self, now: float, ready: int, counting: bool) -> None:
        """``ready``: standbys ready now; ``counting``: the job is training (wants cover)."""
        uncovered = counting and self.wanted > 0 and ready == 0
        if uncovered and self._since is None:
            self._since = now
            self.spells += 1
        elif not uncovered and self._since is not None:
            self.total += now - self._since
            self._since = None

    def seconds(self, now: float) -> float:
        return self.total + (now - self._since if self._since is not None else 0.0)


# ---------------------------------------------------------------- promotion


def build_promotion(layout: Any, standby: int, group: int, attempt: int, ranks: int, decision: dict, now: float) -> Promotion:
    return Promotion(
        standby=standby,
        group=group,
        replica_id=f"group_{group}",
        attempt=attempt,
        ranks={
            str(r): {"report_path": layout.report(group, r, attempt), "spec_path": layout.spec(group, r, attempt), "scratch_dir": layout.scratch(group, r)}
            for r in range(ranks)
        },
        checkpoint_dir=layout.checkpoint(group),
        decision=decision,
        promoted_at=now,
    )


def promoted_spec(spec: Any, promotion: Promotion) -> Any:
    """The rank's spec as the group it now is (a RankSpec; same store, host and transport)."""
    mine = promotion.ranks[str(spec.rank)]
    return dataclasses.replace(
        spec,
        group=promotion.group,
        attempt=promotion.attempt,
        report_path=mine["report_path"],
        scratch_dir=mine["scratch_dir"],
        start_gate="",
        load_step=None,
        promotion_path="",
    )


# A waiting standby gives up once its controller's heartbeat is this many beats old (at
# least ORPHAN_MIN_S, at most controller.lease_s): nothing could promote it any more.
ORPHAN_BEATS = 10
ORPHAN_MIN_S = 10.0


def orphan_after_s(heartbeat_s: float, lease_s: float) -> float:
    """How stale the controller's heartbeat may get before a waiting standby gives up. Much
    shorter than a training rank's lease: a standby holds no state worth waiting for, only
    an allocation (a Slurm job, cores)."""
    return min(lease_s, max(ORPHAN_MIN_S, ORPHAN_BEATS * heartbeat_s))


def standby_orphaned(beat_time: Optional[float], beat_pid: Optional[int], launched_by: Optional[int], now: float, stale_s: float) -> Optional[str]:
    """Why a waiting standby will never be promoted (its controller is gone), or None.

    Args:
        beat_time: when the controller's heartbeat (RunLayout.controller_heartbeat) was last
            refreshed; None if there is none (then nothing is decided).
        beat_pid: the pid the heartbeat names.
        launched_by: the pid it named when the standby started (its own controller).
        now: the time now.
        stale_s: orphan_after_s.
    """
    if beat_time is None:
        return None
    if launched_by is not None and beat_pid is not None and beat_pid != launched_by:
        # A controller that attached numbers and launches standbys of its own.
        return f"controller {launched_by} was replaced by {beat_pid}"
    if now - beat_time > stale_s:
        return f"no controller heartbeat for {now - beat_time:.0f} s"
    return None


class ControllerWatch:
    """A waiting standby's view of the controller that launched it (looked at once a second).

    Args:
        heartbeat_path: RunLayout.controller_heartbeat.
        stale_s: orphan_after_s.
    """

    def __init__(self, heartbeat_path: str, stale_s: float, check_every_s: float = 1.0) -> None:
        self.path, self.stale_s, self.check_every_s = heartbeat_path, stale_s, check_every_s
        self.launched_by = self._beat()[1]
        self._checked = time.time()

    def _beat(self) -> tuple[Optional[float], Optional[int]]:
        from monarch_ft.records.lease import heartbeat_time
        from monarch_ft.records.layout import read_json

        beat = heartbeat_time(self.path)
        if beat is None:
            return None, None
        try:
            return beat, (read_json(self.path) or {}).get("pid")
        except (OSError, ValueError):
            return None, None

    def gone(self) -> Optional[str]:
        now = time.time()
        if now - self._checked < self.check_every_s:
            return None
        self._checked = now
        beat_time, beat_pid = self._beat()
        if self.launched_by is None:
            self.launched_by = beat_pid
        return standby_orphaned(beat_time, beat_pid, self.launched_by, now, self.stale_s)


def wait_for_promotion(path: str, poll_s: float = PROMOTION_POLL_S, orphaned: Optional[Callable[[], Optional[str]]] = None) -> Promotion | str:
    """Block until the supervisor writes ``path`` (atomically), sleeping between looks; or
    return why the controller will never write it (``orphaned()``, e.g. ControllerWatch.gone).

    Besides that, a standby is ended by a signal: the supervisor's stop at the job's end, or
    with its controller (RankLaunch.die_with_controller: PR_SET_PDEATHSIG locally, the job's
    cancellation and the task wrapper with slurm). The heartbeat check covers what those
    cannot: a Slurm standby on another node, or Monarch procs (which outlive a SIGKILLed
    controller), must not hold their allocation until the job's time limit."""
    from monarch_ft.records.layout import read_json

    while True:
        data = read_json(path)
        if data:
            return Promotion(**data)
        reason = orphaned() if orphaned is not None else None
        if reason:
            return reason
        time.sleep(poll_s)


def renice_threads(niceness: int = 0) -> Optional[str]:
    """Give every thread of this process ``niceness`` (Linux niceness is per thread, and a
    standby's threads were all started niced). Lowering it needs CAP_SYS_NICE: the error
    is returned (and reported) rather than raised, the promoted group then runs niced."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError as e:
        return str(e)
    error = None
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
    return error


# ---------------------------------------------------------------- the supervisor's pool
@dataclass
class Standby:
    """One standby group in the pool.

    Args:
        number: its number (one per standby ever launched; names its files).
        slot: the host/device slot it was placed on (a simulated host of its own).
        ranks: its ranks' supervisor-side states (supervisor.RankState).
    """

    number: int
    slot: int
    ranks: list
    launched_at: float
    status: StandbyStatus = StandbyStatus.BUILDING
    ready_at: Optional[float] = None
    ready_ranks: set = field(default_factory=set)


class StandbyPool:
    """The supervisor's standby groups: launch, readiness, loss, promotion, and the clock of
    time without a ready one. The supervisor applies what this decides; it launches
    through ``launch`` (a callable that writes the specs and starts the ranks).

    Args:
        wanted: standby groups to keep (resolve_standby_groups).
        first_slot: the first host/device slot a standby may use (after the groups').
        emit: the event log's emit.
        launch: ``launch(number, slot, now) -> list of RankState``.
        first_number: the first standby number to use (RunLayout.next_standby_number: a
            controller that attached numbers its standbys after its predecessors').
    """

    def __init__(self, wanted: int, first_slot: int, emit: Callable[..., Any], launch: Callable[[int, int, float], list], first_number: int = 0) -> None:
        self.wanted = wanted
        self.first_number = first_number
        self.first_slot = first_slot
        self._emit = emit
        self._launch = launch
        self.standbys: list[Standby] = []
        self.clock = UnreadyClock(wanted)
        self.launched = self.promoted = self.lost = 0
        self.failed_builds = 0  # lost while building, in a row (see MAX_FAILED_BUILDS)
        self.ready_s: list[float] = []  # launch -> ready, per standby

    def ready(self) -> list[Standby]:
        return [s for s in self.standbys if s.status == StandbyStatus.READY]

    def tick(self, now: float, training_started: bool, job_finishing: bool) -> None:
        """Read the standbys' reports, replace lost ones, start missing ones."""
        for sb in list(self.standbys):
            for rs in sb.ranks:
                for rec in rs.tail.read():
                    if rec.get("type") == "event" and rec.get("event") == "standby_ready":
                        sb.ready_ranks.add(rec["rank"])
                if rs.exited is None:
                    rs.exited = rs.proc.poll()
            reason = standby_loss([rs.exited for rs in sb.ranks])
            if reason is not None:
                self._lose(sb, reason)
                continue
            if sb.status == StandbyStatus.BUILDING and len(sb.ready_ranks) == len(sb.ranks):
                sb.status, sb.ready_at = StandbyStatus.READY, now
                self.failed_builds = 0
                self.ready_s.append(now - sb.launched_at)
                self._emit(EventKind.STANDBY_READY, standby=sb.number, slot=sb.slot, build_s=round(now - sb.launched_at, 3))
        for _ in range(standbys_to_launch(self.wanted, len(self.standbys), training_started, job_finishing, self.failed_builds)):
            number = self.first_number + self.launched
            self.launched += 1
            sb = Standby(number, self.first_slot + number - self.first_number, [], now)
            sb.ranks = self._launch(number, sb.slot, now)
            self.standbys.append(sb)
            self._emit(EventKind.STANDBY_LAUNCHED, standby=number, slot=sb.slot, niceness=STANDBY_NICENESS, pids=[rs.proc.pid for rs in sb.ranks])
        self.clock.update(now, len(self.ready()), training_started and not job_finishing)

    def _lose(self, sb: Standby, reason: str) -> None:
        for rs in sb.ranks:
            if rs.exited is None or rs.proc.poll() is None:
                rs.proc.kill()
                rs.exited = rs.proc.wait(10.0)
        self.failed_builds = 0 if sb.ready_at is not None else self.failed_builds + 1
        sb.status = StandbyStatus.LOST
        self.standbys.remove(sb)
        self.lost += 1
        self._emit(
            EventKind.STANDBY_LOST,
            standby=sb.number,
            reason=reason,
            was_ready=sb.ready_at is not None,
            rebuild=self.failed_builds < MAX_FAILED_BUILDS,
        )

    def take(self, now: float, os_state: Callable[[Optional[int]], Optional[str]]) -> Optional[Standby]:
        """The oldest ready standby that is alive and runnable, removed from the pool (its
        ranks now belong to a group); a dead or stopped one found here is lost, never promoted."""
        for sb in sorted(self.ready(), key=lambda s: s.ready_at or 0.0):
            codes = [rs.proc.poll() if rs.exited is None else rs.exited for rs in sb.ranks]
            reason = standby_loss(codes, [os_state(rs.proc.pid) for rs in sb.ranks])
            if reason is not None:
                self._lose(sb, reason)
                continue
            sb.status = StandbyStatus.PROMOTED
            self.standbys.remove(sb)
            self.promoted += 1
            self.clock.update(now, len(self.ready()), True)
            return sb
        return None

    def stop(self) -> None:
        """End every standby (job end): SIGTERM, then SIGKILL."""
        import signal

        for sb in self.standbys:
            for rs in sb.ranks:
                if rs.exited is None:
                    rs.proc.send_signal(signal.SIGTERM)
        for sb in self.standbys:
            for rs in sb.ranks:
                if rs.exited is None:
                    rs.exited = rs.proc.wait(5.0)
                    if rs.exited is None:
                        rs.proc.kill()
                        rs.exited = rs.proc.wait(5.0)

    def summary(self, now: float) -> dict:
        return {
            "standby_groups": self.wanted,
            "launched": self.launched,
            "promoted": self.promoted,
            "lost": self.lost,
            "build_s": [round(s, 2) for s in self.ready_s],
            # How long the job trained with no ready standby (first build, rebuilds after a promotion or a loss).
            "seconds_without_ready_standby": round(self.clock.seconds(now), 3),
            "spells_without_ready_standby": self.clock.spells,
        }
