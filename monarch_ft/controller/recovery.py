"""Recovery, applied: the loop's side of :mod:`monarch_ft.controller.planner`.

A failed group is stopped, described as a :class:`~monarch_ft.controller.planner.Failure`, and
the planner's :class:`~monarch_ft.controller.planner.RecoveryAction` is carried out here: a
standby promoted, a relaunch scheduled (and, when its backoff is over, started warm or cold:
:meth:`Recovery.launch`), every group restarted from one checkpoint, a group given up, the job
stopped when its state is lost. So is the other decision a relaunch waits for, where its state
comes from (:meth:`Recovery.resume_point`, at its launch gate or its promotion), with the disk
side it may need: the newest intact checkpoint, found, verified, copied where missing, and a
copy that failed to load quarantined.

So are the integrity checks' verdicts (:meth:`Recovery.integrity_verdicts`: a corrupt or
suspect group failed, replicas with no majority rolled back), each through the planner as a
typed failure, and the checkpoints saved since a state that is no longer trusted set aside.

``recovery_path`` is emitted here, once per relaunch (:meth:`Recovery.relaunched`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Union

from monarch_ft.common.clock import Clock
from monarch_ft.common.process import process_status
from monarch_ft.config.job import JobConfig
from monarch_ft.controller.budget import crash_loop, crash_loop_line, startup_failure
from monarch_ft.controller.checkpoints import quarantine_step, recover_checkpoint
from monarch_ft.controller.fork_pool import ForkError, WarmForks
from monarch_ft.controller.integrity import Corrupt, Diverged, IntegrityJudge, Suspect, Verdict
from monarch_ft.controller.launch import RankStarter
from monarch_ft.controller.node_watch import NodeWatch
from monarch_ft.controller.placement import Suspect as NodeSuspect
from monarch_ft.controller.planner import (
    ColdStart,
    DiskFact,
    Failure,
    FailureKind,
    ForkFact,
    FullRestart,
    GiveUp,
    Promote,
    RecoveryAction,
    RecoveryPlanner,
    Relaunch,
    StateLost,
    WarmFork,
)
from monarch_ft.controller.standby_pool import Standby, StandbyPool
from monarch_ft.controller.state import GroupState, JobState, RankState
from monarch_ft.records.decisions import StateDecision, StateSource, needs_disk
from monarch_ft.records.events import EventKind, EventLog, GiveUpReason, GroupStatus, RecoveryPath
from monarch_ft.records.layout import RunLayout, atomic_write, atomic_write_json
from monarch_ft.records.manifest import complete_steps, step_dir
from monarch_ft.records.reports import ReportTail


class Recovery:
    """Applies the planner's decisions to the job.

    Args:
        cfg: the job's config.
        layout: the run directory's paths.
        state: the job's state.
        planner: decides.
        events: the event log.
        starter: starts, promotes and stops ranks.
        standby: the standby pool.
        forks: the warm fork servers.
        clock: the controller's clock.
        save: writes controller.json (after a launch: the new ranks' pids before anything else).
        nodes: the watch of a cluster's nodes (the nodes a failure implicates, the exclusions
            an action decides).
        judge: the integrity checks (controller.integrity): a checkpoint whose manifest's
            fingerprint is not what the replicas agreed on at its step is damaged too; None: none.
    """

    def __init__(
        self,
        cfg: JobConfig,
        layout: RunLayout,
        state: JobState,
        planner: RecoveryPlanner,
        events: EventLog,
        starter: RankStarter,
        standby: StandbyPool,
        forks: WarmForks,
        clock: Clock,
        save: Callable[[], None],
        nodes: NodeWatch,
        judge: Optional[IntegrityJudge] = None,
    ) -> None:
        self.cfg = cfg
        self.layout = layout
        self.state = state
        self.planner = planner
        self.events = events
        self.starter = starter
        self.standby = standby
        self.forks = forks
        self.clock = clock
        self.save = save
        self.nodes = nodes
        self.judge = judge
        # When each group's first launch began to wait for its host's fork server.
        self._first_wait: dict[int, float] = {}

    # ------------------------------------------------------------ failures
    def fail_group(self, g: GroupState, now: float, kind: FailureKind, suspects: tuple[NodeSuspect, ...] = (), **why: Any) -> None:
        """Stop ``g`` (failed: ``kind``; ``why`` goes into its group_failed event) and recover.
        ``suspects``: nodes the caller already holds against it (a straggler's), besides those
        its ranks' ends implicate."""
        self.events.emit(EventKind.GROUP_FAILED, group=g.index, attempt=g.attempt, **why)
        # Before its ranks are stopped: how they ended says whether their node is suspect.
        found = self.nodes.suspects([rs.proc for rs in g.ranks if rs.proc is not None])
        suspects = (*suspects, *(s for s in found if s.node not in {t.node for t in suspects}))
        self.starter.stop(g, graceful=False)
        self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt)
        error = g.error()
        g.last_error = {k: error.get(k) for k in ("error", "error_type", "frame", "rank", "attempt")} if error else None
        self.recover(Failure(kind, g.index, startup_failure(g.stepped(), [rs.error for rs in g.ranks if rs.error]), suspects), now)

    def fail_job_stall(self, now: float) -> None:
        """Every stepping group stalled past ``ft.stall_timeout_s``."""
        self.recover(Failure(FailureKind.STALL), now)

    # ------------------------------------------------------------ silent data corruption (controller.integrity)
    def integrity_verdicts(self, verdicts: list[Verdict], now: float) -> None:
        """Act on the integrity checks' verdicts of this tick, each as a typed failure the
        planner decides on (the ordinary recovery paths); a verdict on an attempt already
        replaced is moot."""
        for v in verdicts:
            if isinstance(v, Corrupt):
                self._corrupt(v, now)
            elif isinstance(v, Diverged):
                self._diverged(v, now)
            elif isinstance(v, Suspect):
                g = self.state.groups[v.group]
                if g.attempt == v.attempt and g.active:
                    self.events.emit(EventKind.GROUP_SUSPECT, group=v.group, attempt=v.attempt, step=v.step, vetoes=v.vetoes)
                    if self.judge is not None:
                        self.judge.condemn({v.group: v.attempt})
                    self.fail_group(g, now, FailureKind.SUSPECT, reason=FailureKind.SUSPECT, step=v.step, vetoes=v.vetoes)

    def _corrupt(self, v: Corrupt, now: float) -> None:
        """A minority of replicas disagreed with the majority: each is failed (it heals from a
        majority peer through the normal recovery path), its checkpoints since it last agreed
        set aside."""
        for group, attempt in sorted(v.blamed.items()):
            g = self.state.groups[group]
            if g.attempt != attempt or not g.active:
                continue
            why = f"saved after group {group} last agreed with its peers (step {v.trusted[group]})"
            # Before the failure too: a full restart (ft.recovery=full_restart) chooses its step in it.
            self.quarantine_newer(group, v.trusted[group], why)
            self.events.emit(
                EventKind.SDC_DETECTED,
                group=group,
                attempt=attempt,
                step=v.record_step,
                state_step=v.step,
                after_veto=v.vetoed,
                ranks=list(v.ranks[group]),
                tensors=list(v.tensors[group]),
                majority=list(v.majority),
                trusted_step=v.trusted[group],
                action="fail_group",
            )
            self.fail_group(g, now, FailureKind.CORRUPT, reason=FailureKind.CORRUPT, step=v.record_step, tensors=list(v.tensors[group]))
            self.quarantine_newer(group, v.trusted[group], why)  # a save that finished meanwhile

    def _diverged(self, v: Diverged, now: float) -> None:
        """No majority: nobody holds a state known good but the one they last agreed on; the
        job goes back to the newest checkpoint at or before it (the planner's FullRestart) and
        every newer one is set aside."""
        if any(self.state.groups[g].attempt != a for g, a in v.attempts.items()):
            return  # already relaunched since (an earlier verdict)
        self.events.emit(
            EventKind.SDC_DETECTED,
            groups=list(v.groups),
            step=v.record_step,
            state_step=v.step,
            after_veto=v.vetoed,
            tensors=list(v.tensors),
            trusted_step=v.trusted_step,
            action="rollback",
        )
        if self.judge is not None:
            self.judge.rolled_back(v.trusted_step, dict(v.attempts))
        self.recover(Failure(FailureKind.DIVERGED, at_most=v.trusted_step), now)
        for g in self.state.groups:
            self.quarantine_newer(g.index, v.trusted_step, f"saved after the replicas last agreed (step {v.trusted_step})")

    def quarantine_newer(self, group: int, step: int, why: str) -> None:
        """Set aside the group's complete checkpoints newer than ``step``: they may hold corrupt state."""
        for s in sorted(complete_steps(self.layout.checkpoint(group))):
            if s > step:
                self.quarantine_copy(group, s, why, "the integrity check")

    def quarantine_copy(self, group: int, step: int, problem: str, by: str) -> None:
        """Move group ``group``'s copy of ``step`` aside (``by``: who found it damaged) and record it."""
        moved, failed = None, None
        try:
            moved = quarantine_step(step_dir(self.layout.checkpoint(group), step), problem, by=by)
        except OSError as e:
            failed = str(e)
        self._record_quarantine(group, step, moved, problem, failed)

    def recover(self, failure: Failure, now: float) -> None:
        """Ask the planner about ``failure`` and carry out its action; nothing once the job's
        state is lost (another group dead in the same tick found no state to resume from)."""
        if self.state.watch.fatal:
            return
        disk = self.disk_fact(at_most=self.state.job_step) if self.planner.needs_disk(self.state, failure) else None
        g = self.state.groups[failure.group] if failure.group is not None else None
        while True:
            action = self.planner.decide(self.state, failure, now, self.standby.ready_numbers(), disk)
            if not isinstance(action, Promote):
                break
            standby = self.standby.claim(action.standby, now, process_status)
            if standby is not None:
                break
            # Found dead or stopped (lost, never promoted): decide again without it.
        if action.exclude is not None and g is not None:
            # Before anything is launched: no allocation from now on lands on a suspect node.
            self.nodes.exclude(failure.suspects, g.index, g.attempt, now, action.exclude)
        if g is not None:
            # Compared with the next attempt's: the same failure at start-up twice is a crash loop.
            g.startup_failure = failure.startup
        if isinstance(action, Promote):
            self._promote(g, action, standby, now, disk)
        elif isinstance(action, GiveUp):
            self._give_up(g, action, now)
        elif isinstance(action, FullRestart):
            self.full_restart(g, now, action)
        elif isinstance(action, StateLost):
            self.lose_job(action.reason)
        elif isinstance(action, Relaunch):
            self._schedule(g, now, action)

    def _promote(self, g: GroupState, action: Promote, sb: Standby, now: float, disk: Optional[DiskFact]) -> None:
        """Put the claimed standby ``sb`` in failed group ``g``'s place (live recovery)."""
        decision = self.resume_point("no_live_peer", self.state.live_peers(g.index), g.index, disk)
        if isinstance(decision, StateLost):
            self.standby.put_back(sb)  # stopped with the job
            self.lose_job(decision.reason)
            return
        if action.charged:
            self._count_restart(g, now)
        g.attempt += 1
        decision = self._with_copy(g, decision)
        g.ranks = self.starter.promote(sb, g, decision, now)
        g.move(GroupStatus.STARTING)
        g.launched_at, g.train_done = now, False
        g.load_step, g.load_path, g.start_gate, g.gate_decided, g.load_failure = None, None, "", True, None
        self.events.emit(
            EventKind.RESTART_SCHEDULED, group=g.index, restart=g.restarts, backoff_s=0.0, path=action.path, action=action.kind, because=action.reason
        )
        self.relaunched(g, action, standby=sb.number)
        self.events.emit(EventKind.STANDBY_PROMOTED, standby=sb.number, group=g.index, attempt=g.attempt, ready_for_s=round(now - (sb.ready_at or now), 3))
        self.events.emit(EventKind.GROUP_LAUNCHED, group=g.index, attempt=g.attempt, launcher=self.starter.launcher.name, standby=sb.number)
        self.events.emit(
            EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=self.state.job_step
        )

    def _schedule(
        self, g: GroupState, now: float, action: Relaunch, load_step: Optional[int] = None, start_gate: str = "", load_path: Optional[str] = None
    ) -> None:
        """Relaunch ``g`` after the action's backoff. An uncharged relaunch (a checkpoint that
        failed to load, quarantined: the next attempt tries another step) neither counts
        against the budget nor backs off further."""
        if action.charged:
            self._count_restart(g, now)
        g.move(GroupStatus.WAITING)
        g.next_launch, g.load_step, g.load_path, g.start_gate = now + action.backoff_s, load_step, load_path, start_gate
        self.events.emit(
            EventKind.RESTART_SCHEDULED,
            group=g.index,
            restart=g.restarts,
            backoff_s=round(action.backoff_s, 3),
            action=action.kind,
            because=action.reason,
            **({} if action.charged else {"counted": False}),
        )

    def _count_restart(self, g: GroupState, now: float) -> None:
        g.restarts += 1
        g.restart_times = self.planner.policy.budget.charge(g.restart_times, now)

    def full_restart(self, failed: Optional[GroupState], now: float, action: FullRestart) -> None:
        """The whole job stops and resumes from one disk checkpoint.

        The baseline policy (``ft.recovery=full_restart``) on every fault, and the escalation
        of a job-wide stall. Every group loads the same step (the newest complete one any
        group wrote; a group without it gets a copy, as from shared storage) and waits at a
        fresh start gate, so the job comes back as one quorum instead of groups healing from
        each other.
        """
        for g in self.state.groups:
            if g is not failed and g.active:
                self.starter.stop(g, graceful=False)
                # Stopped, not failed: its next start-up failure is not a second one in a row.
                g.startup_failure = None
                self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt, reason=action.trigger)
        restarting = [g for g in self.state.groups if g.status != GroupStatus.GIVEN_UP and (g is failed or g.status != GroupStatus.DONE)]
        decision = self.resume_point(action.trigger, at_most=action.at_most)
        if isinstance(decision, StateLost):
            self.lose_job(decision.reason)
            return
        step = decision.step
        self.state.full_restarts += 1
        self.state.gate_since = now
        self.events.emit(EventKind.FULL_RESTART, failed_group=failed.index if failed else None, resume_step=step, reason=action.trigger)
        for g in restarting:
            each = self.planner.reschedule(self.state, g.index, action.charged, now)
            if isinstance(each, GiveUp):
                self._give_up(g, each, now)
            else:
                self._schedule(g, now, each, load_step=step, start_gate=self.gate_path, load_path=self.load_path(g.index, step))

    def _give_up(self, g: GroupState, action: GiveUp, now: float) -> None:
        g.move(GroupStatus.GIVEN_UP)
        g.gave_up = action.why
        if action.why is GiveUpReason.CRASH_LOOP:
            self._crash_loop(g)
            return
        budget = self.planner.policy.budget
        self.events.emit(
            EventKind.RESTART_BUDGET_EXHAUSTED,
            group=g.index,
            restarts=g.restarts,
            recent_restarts=budget.recent(g.restart_times, now),
            max_restarts=budget.max_restarts,
            restart_window_s=budget.window_s,
            last_error=g.last_error["error"] if g.last_error else None,
        )

    def _crash_loop(self, g: GroupState) -> None:
        """``g``'s last two launches failed the same way at start-up. One console line per
        distinct failure, with the ranks' own error line: a second group failing the same way
        is named by its event, not by the same line again."""
        failure = g.startup_failure or {}
        first = next(
            (o.index for o in self.state.groups if o is not g and o.gave_up == GiveUpReason.CRASH_LOOP and crash_loop(o.startup_failure, failure)), None
        )
        log_path = self.layout.log(g.index, failure.get("rank") or 0, failure.get("attempt", g.attempt))
        self.events.emit(
            EventKind.CRASH_LOOP,
            group=g.index,
            attempt=g.attempt,
            failures=2,
            error_type=failure.get("error_type"),
            frame=failure.get("frame"),
            same_as_group=first,
            log=log_path,
        )
        if first is None:
            print(f"monarch_ft: error: {crash_loop_line(g.index, failure, log_path)}", file=sys.stderr, flush=True)

    def lose_job(self, message: str) -> None:
        """The job's state is gone (no live group, no checkpoint): stop with one clear line,
        the first one said (the job stops at the next tick)."""
        if self.state.watch.fatal:
            return
        self.state.watch.fatal = message
        self.events.emit(EventKind.JOB_STATE_LOST, job_step=self.state.job_step, message=message)
        print(f"monarch_ft: error: {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ relaunches
    def launch(self, g: GroupState, now: float) -> None:
        """Start ``g``'s next attempt (its backoff is over): warm or cold, as the planner says;
        a first launch waiting for its host's fork server returns without one (the next tick
        asks again: the group stays WAITING)."""
        fork = ForkFact(self.forks.problem(), self.forks.server_state(g.index), self.forks.exhausted(g.index))
        first = None
        if g.attempt < 0:
            first = self.planner.first_launch(fork, now - self._first_wait.setdefault(g.index, now))
            if first is None:
                return
        g.attempt += 1
        if g.attempt > 0 and not g.start_gate:
            # A live relaunch: whether it heals from a peer or loads the disk checkpoint is
            # decided when it is ready to join (open_launch_gates), not now: the peers alive
            # at launch may all be gone by then.
            g.start_gate = self.layout.launch_gate(g.index, g.attempt)
        g.gate_decided = False
        g.load_failure = None
        g.loading = None if g.load_step is None else (g.load_step, g.load_path or step_dir(self.layout.checkpoint(g.index), g.load_step))
        action = self.planner.launch(self.state, g.index, fork)
        launches = self.starter.group_launches(g)
        procs = None
        # How the ranks came up (group_launched): forked from the host's server, or cold and why.
        how: dict[str, Any] = {"forked": False}
        if isinstance(action, WarmFork) or (first is not None and first[0] is RecoveryPath.WARM_FORK):
            try:
                procs = self.starter.start(launches, warm=True)
                how["forked"] = True
            except ForkError as e:
                if action is not None:
                    action = self.planner.fork_failed(action, str(e))
                else:
                    how["cold_because"] = str(e)
        if procs is None:
            procs = self.starter.start(launches, warm=False)
            if first is not None:
                how.setdefault("cold_because", first[1])
        if action is not None:
            self.relaunched(g, action)
        g.ranks = [RankState.launched(p, ReportTail(self.layout.report(g.index, p.launch.rank, g.attempt)), now) for p in procs]
        g.move(GroupStatus.STARTING)
        g.launched_at, g.train_done = now, False
        self.events.emit(EventKind.GROUP_LAUNCHED, group=g.index, attempt=g.attempt, launcher=self.starter.launcher.name, **how)
        for p in procs:
            self.events.emit(EventKind.RANK_LAUNCHED, group=g.index, rank=p.launch.rank, attempt=g.attempt, pid=p.pid, host=p.launch.host)
        self.save()  # their pids and start times, before anything else can happen

    def relaunched(self, g: GroupState, action: RecoveryAction, **fields: Any) -> None:
        """How ``g``'s relaunch came up (``recovery_path``): the one place it is recorded."""
        if isinstance(action, ColdStart):
            fields["cold_because"] = action.reason
            if action.planned is not None:
                fields["planned"] = action.planned
        self.events.emit(EventKind.RECOVERY_PATH, group=g.index, attempt=g.attempt, path=action.path, **fields)

    @property
    def gate_path(self) -> str:
        """The shared gate the current generation of launches waits at."""
        return self.layout.start_gate(self.state.full_restarts)

    def open_launch_gates(self) -> None:
        """Tell each live-relaunched group, once all its ranks are ready, where its state comes
        from: a live peer (it heals through TorchFT when it joins the quorum), or, with no
        group left holding the job's state, the newest disk checkpoint (never its initial
        weights once the job has committed steps)."""
        for g in self.state.groups:
            if g.status != GroupStatus.STARTING or g.gate_decided or g.start_gate != self.layout.launch_gate(g.index, g.attempt):
                continue
            if not (g.ranks and all(r.model_ready for r in g.ranks)):
                continue
            decision = self.resume_point("no_live_peer", self.state.live_peers(g.index), g.index)
            if isinstance(decision, StateLost):
                self.lose_job(decision.reason)
                return
            decision = self._with_copy(g, decision)
            atomic_write_json(g.start_gate, decision.to_record())
            g.gate_decided = True
            self.events.emit(
                EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=self.state.job_step
            )

    # ------------------------------------------------------------ where the state comes from
    def resume_point(
        self,
        reason: str,
        live_peers: tuple[int, ...] = (),
        group: Optional[int] = None,
        disk: Optional[DiskFact] = None,
        at_most: Optional[int] = None,
    ) -> Union[StateDecision, StateLost]:
        """Decide where the job's state comes from now; for a disk checkpoint, the newest
        intact one (verified, damaged copies quarantined, copied into every group's folder:
        :meth:`disk_fact`), and record the rollback. :class:`StateLost` names every step tried
        when none was intact. ``at_most``: no checkpoint newer than this step (the replicas'
        state after it is not trusted: an integrity rollback)."""
        state = self.state
        if disk is None and needs_disk(live_peers, state.job_step):
            disk = self.disk_fact(at_most=state.job_step if at_most is None else min(at_most, state.job_step))
        decision = self.planner.state_source(state, live_peers, disk)
        if isinstance(decision, StateDecision) and decision.source is StateSource.DISK:
            if decision.steps_lost:
                rollback = {"from_step": state.job_step, "to_step": decision.step, "steps_lost": decision.steps_lost, "reason": reason, "group": group}
                state.rollbacks.append(rollback)
                self.events.emit(EventKind.JOB_ROLLBACK, **rollback)
            state.ledger.rollback(decision.step)
            self.write_floor(force=True)
        return decision

    def write_floor(self, force: bool = False) -> None:
        """Tell the ranks the job's committed step (control/commit_floor) when it changed."""
        watch = self.state.watch
        if force or self.state.job_step != watch.floor_written:
            atomic_write(self.layout.commit_floor, str(self.state.job_step))
            watch.floor_written = self.state.job_step

    def resume_job(self) -> None:
        """checkpoint.resume: every group loads the newest intact step any group saved
        (copied where missing), and the job's committed step starts there. Checkpoints on
        disk of which none is intact stop the job (one line naming each), rather than
        training again from the initial weights."""
        step = self.recover_checkpoint(at_most=None) if self.cfg.checkpoint.enable else None
        if step is None and self.state.ckpt_health.quarantined:
            self.lose_job(
                f"checkpoint.resume=true and no intact disk checkpoint is left: {'; '.join(self.tried())}; each was moved to its "
                "group folder's quarantine/ (nothing deleted; python -m monarch_ft verify RUN_DIR checks what is on disk)"
            )
            return
        for g in self.state.groups:
            g.load_step, g.load_path = step, self.load_path(g.index, step)
        if step is not None:
            self.state.ledger.rollback(step)
        self.events.emit(EventKind.JOB_RESUMED, step=step)

    def disk_fact(self, at_most: Optional[int]) -> DiskFact:
        """The newest intact checkpoint now (:meth:`recover_checkpoint`), and the steps tried."""
        step = self.recover_checkpoint(at_most=at_most) if self.cfg.checkpoint.enable else None
        return DiskFact(step, tuple(self.tried()))

    def recover_checkpoint(self, at_most: Optional[int]) -> Optional[int]:
        """The newest intact checkpoint step (not after ``at_most``), made loadable by every
        group (controller.checkpoints.recover_checkpoint): each damaged copy met on the way is
        quarantined and named in an event, and a copy that cannot be made (a full disk)
        points that group at the intact copy instead. Runs on the recovery path only: it
        reads every byte of the copies it checks."""
        folders = {self.layout.checkpoint(g.index): g.index for g in self.state.groups}
        vouch = self.judge.vouch if self.judge is not None else None
        rec = recover_checkpoint(list(folders), at_most=at_most, exclude=set(self.state.unloadable), verified=self.state.verified, vouch=vouch)
        for q in rec.quarantined:
            self._record_quarantine(folders[q["folder"]], q["step"], q["path"], q["problem"], q.get("error"))
        for c in rec.copy_failures:
            self.events.emit(EventKind.CHECKPOINT_COPY_FAILED, group=folders[c["folder"]], step=c["step"], source=c["source"], error=c["error"])
        self.state.recovered = rec
        return rec.step

    def load_path(self, group: int, step: Optional[int]) -> Optional[str]:
        """The step directory ``group`` loads ``step`` from: the copy the last recovery made
        loadable for it (its own, or an intact one elsewhere); None: its own folder's."""
        rec = self.state.recovered
        if step is None or rec is None or rec.step != step:
            return None
        return rec.paths.get(self.layout.checkpoint(group))

    def _with_copy(self, g: GroupState, decision: StateDecision) -> StateDecision:
        """A DISK decision with the copy ``g`` loads (which it is then told to load: g.loading)."""
        if decision.source is not StateSource.DISK:
            return decision
        path = self.load_path(g.index, decision.step) or step_dir(self.layout.checkpoint(g.index), decision.step)
        g.loading, g.load_failure = (decision.step, path), None
        return decision.at(path)

    def _record_quarantine(self, group: int, step: int, path: Optional[str], problem: str, error: Optional[str] = None) -> None:
        entry = {"group": group, "step": step, "path": path, "problem": problem}
        if error:
            entry["quarantine_error"] = error  # it could not be moved aside: excluded all the same
        self.state.ckpt_health.observe(self.events.emit(EventKind.CHECKPOINT_QUARANTINED, **entry))

    def tried(self) -> list[str]:
        """Every checkpoint step this job found damaged or could not load, newest first, each
        with why, per group: ``step 150 (group 0: ...; group 1: ...)``."""
        by_step: dict[int, list[str]] = {}
        for q in self.state.ckpt_health.quarantined:
            by_step.setdefault(q["step"], []).append(f"group {q['group']}: {q['problem']}")
        return [f"step {step} ({'; '.join(why)})" for step, why in sorted(by_step.items(), reverse=True)]

    def checkpoint_unloadable(self, g: GroupState) -> bool:
        """``g``'s ranks could not load the checkpoint they were told to (RankExit.
        CHECKPOINT_LOAD_FAILED): quarantine that copy and never choose that step again in this
        job (the bytes matched their manifest when chosen, so any copy of it would likely fail
        alike). False when the step is not known (then it is an ordinary failure)."""
        report = g.load_failure or {}
        step = report.get("step", g.loading[0] if g.loading else None)
        path = report.get("path") or (g.loading[1] if g.loading else None)
        if step is None:
            return False
        error = report.get("error") or "the load raised (see the rank logs)"
        self.state.unloadable[int(step)] = error
        owner = next((o.index for o in self.state.groups if path and os.path.dirname(os.path.normpath(path)) == self.layout.checkpoint(o.index)), g.index)
        moved, failed = None, None
        if path and os.path.isdir(path):
            try:
                moved = quarantine_step(path, f"failed to load: {error}", by=f"a load by group {g.index} (attempt {g.attempt})")
            except OSError as e:
                failed = str(e)
        self._record_quarantine(owner, int(step), moved, f"failed to load: {error}", failed)
        return True
