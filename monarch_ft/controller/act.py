"""The third stage of a tick: act. The executor applies a decision's actions in order, through
the launcher, the pools and the run directory, and writes the events. Nothing here decides:
each action says what to do, its contingency included (a warm fork that fails starts cold).

What it learns by acting is recorded where the next stage reads it: the ranks it started and the
exit codes of the ranks it stopped (on the job's state), the newest intact checkpoint a decision
asked for (:class:`~monarch_ft.controller.decide.base.Facts`, for the tick's next pass).

The controller's own files can fail to be written too (a full or read-only run directory):
events, metrics, the takeover state, the control files and the ranks' specs. Such a failure is
not a traceback: :class:`OwnWriteFailed` stops the actions, and the loop stops the job cleanly
with one line naming the path and the error (:meth:`monarch_ft.controller.loop.Supervisor.tick`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
import time
from typing import IO, Any, Callable, Optional

from monarch_ft.common.stacks import capture_stacks
from monarch_ft.controller import actions as A
from monarch_ft.controller.checkpoints import quarantine_step, recover_checkpoint
from monarch_ft.controller.decide.base import Facts
from monarch_ft.controller.fork_pool import ForkError, WarmForks
from monarch_ft.controller.integrity import IntegrityJudge
from monarch_ft.controller.launch import RankStarter
from monarch_ft.controller.lighthouse import Lighthouse
from monarch_ft.controller.link_probe import LinkProber
from monarch_ft.controller.planner import ColdStart, DiskFact
from monarch_ft.controller.standby_pool import STANDBY_NICENESS
from monarch_ft.controller.state import JobState, RankState
from monarch_ft.launcher import Launcher
from monarch_ft.records.events import EventKind, EventLog, RecoveryPath
from monarch_ft.records.exits import describe_exit
from monarch_ft.records.layout import RunLayout, atomic_write, atomic_write_json
from monarch_ft.records.lease import lower_finish
from monarch_ft.records.manifest import complete_steps, step_dir
from monarch_ft.records.reports import ReportTail


class OwnWriteFailed(Exception):
    """A file of the controller's own could not be written (``path``; ``error`` the OSError)."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(path, error)
        self.path = path
        self.error = error

    def line(self, run_dir: str) -> str:
        """The one console line that says so, and what to do."""
        name = errno.errorcode.get(self.error.errno or 0, "?")
        return (
            f"cannot write the controller's own file {self.path}: {name} ({self.error.strerror or self.error}); the job is stopped (every group "
            f"stopped, the checkpoints on disk intact): make {run_dir} writable (free space), then resume it with checkpoint.resume=true "
            f"hydra.run.dir={run_dir}"
        )


@dataclasses.dataclass
class Acted:
    """What applying a decision's actions gave: the end of the job if one was decided, the facts
    found for the tick's next pass."""

    end: Optional[A.EndJob] = None
    facts: Facts = dataclasses.field(default_factory=Facts)


class Executor:
    """Applies actions (see the module docstring).

    Args:
        state: the job's state (the ranks started and stopped are recorded on it).
        layout: the run directory's paths.
        launcher: starts ranks cold, applies node exclusions.
        starter: writes specs, starts, promotes and stops ranks.
        forks: the warm fork servers.
        lighthouse: the job's Lighthouse.
        prober: the link prober.
        judge: the integrity checks (they vouch for a checkpoint when its copies are verified).
        events: the event log.
        metrics: ``metrics.jsonl``, open for appending.
        save: writes the takeover state; given group indices, only those groups' changes (after
            a launch: the new ranks' pids before anything else, without re-encoding every
            group per launch, which made a first launch of 1,024 groups quadratic).
        clock: the controller's clock.
        checkpoints: ``checkpoint.enable``.
        clear_detach: clears a detach request (a refused detach).
    """

    def __init__(
        self,
        state: JobState,
        layout: RunLayout,
        launcher: Launcher,
        starter: RankStarter,
        forks: WarmForks,
        lighthouse: Lighthouse,
        prober: LinkProber,
        judge: IntegrityJudge,
        events: EventLog,
        metrics: IO[str],
        save: Callable[..., None],
        clock: Callable[[], float],
        checkpoints: bool,
        clear_detach: Callable[[], None],
    ) -> None:
        self.state = state
        self.layout = layout
        self.launcher = launcher
        self.starter = starter
        self.forks = forks
        self.lighthouse = lighthouse
        self.prober = prober
        self.judge = judge
        self.events = events
        self.metrics = metrics
        self.save = save
        self.clock = clock
        self.checkpoints = checkpoints
        self.clear_detach = clear_detach

    # ------------------------------------------------------------ the loop's entry
    def apply(self, decided: list[A.Action]) -> Acted:
        """Apply ``decided`` in order; the disk facts asked for are found after every other action
        (after this pass's quarantines and stops). Raises :class:`OwnWriteFailed` at the first
        file of the controller's own that could not be written."""
        acted = Acted()
        finds: list[A.FindDisk] = []
        for action in decided:
            if isinstance(action, A.FindDisk):
                finds.append(action)
            elif isinstance(action, A.EndJob):
                acted.end = action
            else:
                self._apply(action)
            self.check_own_writes()
        for find in finds:
            acted.facts.disk[find.at_most] = self.find_disk(find.at_most)
            self.check_own_writes()
        return acted

    def check_own_writes(self) -> None:
        """Raise :class:`OwnWriteFailed` if the event log could not write an event."""
        error = self.events.write_error
        if error is not None:
            raise OwnWriteFailed(error.filename or self.layout.events, error)

    def _apply(self, action: A.Action) -> None:
        handler = getattr(self, "_" + type(action).__name__, None)
        if handler is None:
            raise TypeError(f"no executor for {type(action).__name__}")
        try:
            handler(action)
        except OwnWriteFailed:
            raise
        except OSError as e:
            if not own_file_error(e, self.layout):
                raise
            raise OwnWriteFailed(e.filename or self.layout.run_dir, e) from None

    # ------------------------------------------------------------ events and files
    def _Emit(self, a: A.Emit) -> None:
        self.events.emit(a.kind, **a.fields)

    def _WriteMetrics(self, a: A.WriteMetrics) -> None:
        try:
            lines = a.lines or (None,) * len(a.records)
            self.metrics.write("".join((json.dumps(rec) if line is None else line.decode()) + "\n" for rec, line in zip(a.records, lines)))
        except OSError as e:
            e.filename = e.filename or self.layout.metrics
            raise

    def _PrintError(self, a: A.PrintError) -> None:
        print(f"monarch_ft: error: {a.message}", file=sys.stderr, flush=True)

    def _WriteGate(self, a: A.WriteGate) -> None:
        atomic_write_json(a.path, a.decision.to_record())

    def _OpenStartGate(self, a: A.OpenStartGate) -> None:
        with open(a.path, "w"):
            pass

    def _SetHold(self, a: A.SetHold) -> None:
        if a.on:
            with open(self.layout.hold, "w"):
                pass
        elif os.path.exists(self.layout.hold):
            os.remove(self.layout.hold)

    def _WriteFloor(self, a: A.WriteFloor) -> None:
        atomic_write(self.layout.commit_floor, str(a.step))

    def _WriteIntegrityEvery(self, a: A.WriteIntegrityEvery) -> None:
        atomic_write(self.layout.integrity_every, str(a.every))

    def _WriteTransportPeers(self, a: A.WriteTransportPeers) -> None:
        atomic_write_json(self.layout.transport_peers, a.peers)

    def _RequestFinish(self, a: A.RequestFinish) -> None:
        step = lower_finish(self.layout.stop_at_step, a.step)
        self.events.emit(EventKind.FINISH_REQUESTED, step=step, reason=a.reason)

    def _RefuseDetach(self, a: A.RefuseDetach) -> None:
        self.clear_detach()

    # ------------------------------------------------------------ groups
    def _FailGroup(self, a: A.FailGroup) -> None:
        why = dict(a.why)
        if a.stacks_tag is not None:
            t0 = time.time()
            # The hung rank's and its group peers' stacks, before the group is killed.
            why["stacks"] = self.capture_stacks(a.ranks, a.stacks_tag)
            why["stacks_s"] = round(time.time() - t0, 3)
        self.events.emit(EventKind.GROUP_FAILED, group=a.group, attempt=a.attempt, **why)
        self.starter.stop(a.ranks, graceful=False)
        self.events.emit(EventKind.GROUP_STOPPED, group=a.group, attempt=a.attempt)

    def _StopGroup(self, a: A.StopGroup) -> None:
        self.starter.stop(a.ranks, graceful=False)
        self.events.emit(EventKind.GROUP_STOPPED, group=a.group, attempt=a.attempt, reason=a.reason)

    def _ReportStall(self, a: A.ReportStall) -> None:
        ranks = [rs for i in a.groups for rs in self.state.groups[i].ranks]
        stacks = self.capture_stacks(ranks, "stall")
        self.events.emit(
            EventKind.JOB_STALL,
            groups=list(a.groups),
            hangs={str(i): dataclasses.asdict(h) for i, h in a.hangs.items()},
            stacks=stacks,
            escalate_after_s=a.escalate_after_s,
        )

    def capture_stacks(self, ranks, tag: str) -> dict[str, str]:
        """Every live one of ``ranks``' Python stacks (py-spy), into stacks/<tag>-<ms>/; label -> file."""
        pids = {f"g{rs.launch.group}r{rs.rank}": rs.proc.pid for rs in ranks if rs.exited is None and rs.proc is not None and rs.proc.pid}
        logs = {f"g{rs.launch.group}r{rs.rank}": rs.launch.log_path for rs in ranks}
        return capture_stacks(pids, self.layout.stacks_capture(tag, time.time()), logs=logs)

    def _LaunchGroup(self, a: A.LaunchGroup) -> None:
        g = self.state.groups[a.group]
        now = self.clock()
        launches = self.starter.group_launches(a.group, a.attempt, a.load_step, a.load_path, a.gate)
        procs = None
        relaunch = a.relaunch
        # How the ranks came up (group_launched): forked from the host's server, or cold and why.
        how: dict[str, Any] = {"forked": False}
        if a.warm:
            try:
                procs = self.starter.start(launches, warm=True)
                how["forked"] = True
            except ForkError as e:
                if relaunch is not None:
                    # The contingency planned with the launch (RecoveryPlanner.fork_failed).
                    relaunch = ColdStart(str(e), group=a.group, planned=RecoveryPath.WARM_FORK)
                else:
                    how["cold_because"] = str(e)
        if procs is None:
            procs = self.starter.start(launches, warm=False)
            if relaunch is None and a.cold_because is not None:
                how.setdefault("cold_because", a.cold_because)
        if relaunch is not None:
            fields: dict[str, Any] = {}
            if isinstance(relaunch, ColdStart):
                fields["cold_because"] = relaunch.reason
                if relaunch.planned is not None:
                    fields["planned"] = relaunch.planned
            self.events.emit(EventKind.RECOVERY_PATH, group=a.group, attempt=a.attempt, path=relaunch.path, **fields)
        g.ranks = [RankState.launched(p, ReportTail(self.layout.report(a.group, p.launch.rank, a.attempt)), now) for p in procs]
        self.events.emit(EventKind.GROUP_LAUNCHED, group=a.group, attempt=a.attempt, launcher=self.launcher.name, **how)
        for p in procs:
            self.events.emit(EventKind.RANK_LAUNCHED, group=a.group, rank=p.launch.rank, attempt=a.attempt, pid=p.pid, host=p.launch.host)
        self.save(groups=(a.group,))  # their pids and start times, before anything else can happen

    def _PromoteStandby(self, a: A.PromoteStandby) -> None:
        g = self.state.groups[a.group]
        g.ranks = self.starter.promote(a.entry, a.group, a.attempt, a.decision, self.clock())

    # ------------------------------------------------------------ standbys and fork servers
    def _LaunchStandby(self, a: A.LaunchStandby) -> None:
        sb = self.state.standby.find(a.number)
        if sb is None:
            return
        sb.ranks = self.starter.standby(a.number, a.slot, self.clock())
        forked = bool(sb.ranks) and all(rs.proc.forked for rs in sb.ranks)
        pids = [rs.proc.pid for rs in sb.ranks]
        self.events.emit(EventKind.STANDBY_LAUNCHED, standby=a.number, slot=a.slot, niceness=STANDBY_NICENESS, pids=pids, forked=forked)

    def _LoseStandby(self, a: A.LoseStandby) -> None:
        for rs in a.ranks:
            if rs.exited is None or rs.proc.poll() is None:
                rs.proc.kill()
                rs.exited = rs.proc.wait(10.0)
        self.events.emit(EventKind.STANDBY_LOST, standby=a.number, reason=a.reason, was_ready=a.was_ready, rebuild=a.rebuild)

    def _StartForkServer(self, a: A.StartForkServer) -> None:
        self.forks.start_server(a.group, a.n)

    def _CloseForkServer(self, a: A.CloseForkServer) -> None:
        self.forks.close_server(a.host)

    # ------------------------------------------------------------ checkpoints
    def _Quarantine(self, a: A.Quarantine) -> None:
        present = bool(a.path) and os.path.isdir(a.path)
        if a.only_if_present and not present:
            return
        moved, failed = None, None
        if present:
            try:
                moved = quarantine_step(a.path, a.problem, by=a.by)
            except OSError as e:
                failed = str(e)
        self.record_quarantine(a.group, a.step, moved, a.problem, failed)

    def _QuarantineNewer(self, a: A.QuarantineNewer) -> None:
        folder = self.layout.checkpoint(a.group)
        for s in sorted(complete_steps(folder)):
            if s > a.step:
                self._Quarantine(A.Quarantine(a.group, s, a.why, "the integrity check", path=step_dir(folder, s)))

    def record_quarantine(self, group: int, step: int, path: Optional[str], problem: str, error: Optional[str] = None) -> None:
        entry: dict[str, Any] = {"group": group, "step": step, "path": path, "problem": problem}
        if error:
            entry["quarantine_error"] = error  # it could not be moved aside: excluded all the same
        self.state.ckpt_health.observe(self.events.emit(EventKind.CHECKPOINT_QUARANTINED, **entry))

    def find_disk(self, at_most: Optional[int]) -> DiskFact:
        """The newest intact checkpoint no newer than ``at_most``, made loadable by every group
        (controller.checkpoints.recover_checkpoint): each damaged copy met on the way is
        quarantined and named in an event, and a copy that cannot be made (a full disk) points
        that group at the intact copy instead. Reads every byte of the copies it checks: only
        when a decision asks."""
        state = self.state
        step = None
        if self.checkpoints:
            folders = {self.layout.checkpoint(g.index): g.index for g in state.groups}
            rec = recover_checkpoint(list(folders), at_most=at_most, exclude=set(state.unloadable), verified=state.verified, vouch=self.judge.vouch)
            for q in rec.quarantined:
                self.record_quarantine(folders[q["folder"]], q["step"], q["path"], q["problem"], q.get("error"))
            for c in rec.copy_failures:
                self.events.emit(EventKind.CHECKPOINT_COPY_FAILED, group=folders[c["folder"]], step=c["step"], source=c["source"], error=c["error"])
            state.recovered = rec
            step = rec.step
        return DiskFact(step, tuple(tried(state)))

    # ------------------------------------------------------------ the Lighthouse, nodes, probes
    def _RestartLighthouse(self, a: A.RestartLighthouse) -> None:
        now = self.clock()
        lh = self.lighthouse
        self.events.emit(EventKind.LIGHTHOUSE_LOST, pid=lh.pid, address=lh.address, **describe_exit(lh.exit_code))
        # The ranks' quorum ids move to a new range before the new Lighthouse answers their
        # retried quorums (rank.components.lighthouse_epoch).
        atomic_write(self.layout.lighthouse_epoch, str(a.epoch))
        address = lh.restart()
        self.events.emit(EventKind.LIGHTHOUSE_RESTARTED, address=address, pid=lh.pid, down_s=round(self.clock() - now, 3))

    def _SetNodeExclusions(self, a: A.SetNodeExclusions) -> None:
        self.launcher.exclude_nodes(set(a.nodes))

    def _ReplanPending(self, a: A.ReplanPending) -> None:
        # Refused when the job started or ended meanwhile: it is no longer pending (nothing to do).
        self.launcher.replan_pending(a.job_id, set(a.nodes))

    def _StartProbe(self, a: A.StartProbe) -> None:
        self.prober.start(a.targets, a.reason, a.step)


def tried(state: JobState) -> list[str]:
    """Every checkpoint step this job found damaged or could not load, newest first, each with
    why, per group: ``step 150 (group 0: ...; group 1: ...)``."""
    by_step: dict[int, list[str]] = {}
    for q in state.ckpt_health.quarantined:
        by_step.setdefault(q["step"], []).append(f"group {q['group']}: {q['problem']}")
    return [f"step {step} ({'; '.join(why)})" for step, why in sorted(by_step.items(), reverse=True)]


def own_file_error(e: OSError, layout: RunLayout) -> bool:
    """An error writing a file of the controller's own (under the run directory, outside the
    checkpoint folder): a full or read-only run directory."""
    if e.errno not in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM):
        return False
    path = os.path.abspath(str(e.filename)) if e.filename else layout.run_dir
    inside = path == layout.run_dir or path.startswith(layout.run_dir + os.sep)
    return inside and not path.startswith(layout.checkpoint_root + os.sep)
