"""Recovery, decided (what was ``Recovery``): a failed group stopped, its failure answered as the
:class:`~monarch_ft.controller.planner.RecoveryPlanner` says (a standby promoted, a relaunch
scheduled, a full restart, a group given up, the job stopped when its state is lost), its next
launch (warm or cold), its launch gate (where its state comes from), and the integrity checks'
verdicts, each as a typed failure.

A failure is taken in two steps, on purpose. :func:`fail_group` stops the group (status
``STOPPED``, the failure kept on it) when it is judged; :func:`plan_failures` answers every
stopped group's failure once every failure of the pass is known, so no answer counts as a live
peer a group that failed in the same tick. An answer that needs the newest intact checkpoint
(no live peer left) asks for it (``FindDisk``) and is given in the tick's next pass, when the
executor has found it: nothing here reads a disk.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from monarch_ft.controller.actions import (
    FailGroup,
    LaunchGroup,
    PromoteStandby,
    Quarantine,
    QuarantineNewer,
    SetNodeExclusions,
    StopGroup,
    WriteFloor,
    WriteGate,
)
from monarch_ft.controller.budget import crash_loop, crash_loop_line, startup_failure
from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.decide.pools import claim_standby, ready_standbys, server_state, server_exhausted
from monarch_ft.controller.integrity import Corrupt, Diverged, Suspect
from monarch_ft.controller.placement import Suspect as NodeSuspect
from monarch_ft.controller.placement import node_suspicion
from monarch_ft.controller.planner import (
    DiskFact,
    ForkFact,
    FullRestart,
    GiveUp,
    Promote,
    Relaunch,
    StateLost,
    WarmFork,
)
from monarch_ft.controller.state import Failure, FailureKind, GroupState, LaunchPlan, PendingRestart
from monarch_ft.records.decisions import StateDecision, StateSource, needs_disk
from monarch_ft.records.events import EventKind, GiveUpReason, GroupStatus, RecoveryPath
from monarch_ft.records.manifest import step_dir


# ---------------------------------------------------------------- failures
def fail_group(t: Tick, g: GroupState, kind: FailureKind, suspects: tuple[NodeSuspect, ...] = (), stacks_tag: Optional[str] = None, **why: Any) -> None:
    """Stop ``g`` (failed: ``kind``; ``why`` goes into its ``group_failed``); its recovery is
    planned by :func:`plan_failures`. ``suspects``: nodes the caller already holds against it
    (a straggler's), besides those its ranks' ends implicate."""
    # How its ranks ended (before they are stopped) says whether their node is suspect.
    found = node_suspects(t, g)
    suspects = (*suspects, *(s for s in found if s.node not in {x.node for x in suspects}))
    t.out.do(FailGroup(g.index, g.attempt, dict(why), stacks_tag, ranks=tuple(g.ranks)))
    error = g.error()
    g.last_error = {k: error.get(k) for k in ("error", "error_type", "frame", "rank", "attempt")} if error else None
    g.move(GroupStatus.STOPPED)
    g.failure = Failure(kind, g.index, startup_failure(g.stepped(), [rs.error for rs in g.ranks if rs.error]), suspects)


def node_suspects(t: Tick, g: GroupState) -> tuple[NodeSuspect, ...]:
    """The nodes a failed group's ranks, as they ended, implicate (placement.node_suspicion)."""
    pool = t.state.nodes
    if not pool.states or not g.ranks:
        return ()
    codes = [rs.exited for rs in g.ranks]
    out = []
    for node in sorted({rs.launch.host for rs in g.ranks} & set(pool.states)):
        reason = node_suspicion(codes, t.rules.node_health(pool.states[node]))
        if reason is not None:
            out.append(NodeSuspect(node, reason))
    return tuple(out)


def nodes_of(t: Tick, g: GroupState) -> list[str]:
    """The scheduler's nodes ``g``'s ranks run on ([] for a launcher without nodes)."""
    return sorted({rs.launch.host for rs in g.ranks} & set(t.state.nodes.states))


def fail_job(t: Tick, kind: FailureKind, at_most: Optional[int] = None) -> None:
    """The job failed as a whole: every stepping group stalled (``STALL``), or the replicas'
    state disagrees with no majority (``DIVERGED``, no state after ``at_most`` trusted)."""
    recover(t, Failure(kind, at_most=at_most))


def plan_failures(t: Tick) -> None:
    """Answer every stopped group's failure, and go on with a full restart waiting for its
    checkpoint step. A group failure while a full restart is under way is answered by it (the
    group restarts with the job)."""
    if t.state.restart_pending is not None:
        continue_restart(t)
    for g in t.state.groups:
        if g.status != GroupStatus.STOPPED or g.failure is None:
            continue
        if t.state.restart_pending is not None:
            g.failure = None
            continue
        recover(t, g.failure)


def recover(t: Tick, failure: Failure) -> None:
    """Ask the planner about ``failure`` and take its answer; nothing once the job's state is
    lost. An answer that needs the newest intact checkpoint waits for it (the failure stays
    on the stopped group, answered in the tick's next pass)."""
    state, planner = t.state, t.rules.planner
    if state.watch.fatal:
        return
    disk: Optional[DiskFact] = None
    if planner.needs_disk(state, failure):
        disk = disk_fact(t, state.job_step)
        if disk is None:
            t.out.find_disk(state.job_step)
            return
    g = state.groups[failure.group] if failure.group is not None else None
    if g is not None:
        g.failure = None
    while True:
        action = planner.decide(state, failure, t.now, ready_standbys(t), disk)
        if not isinstance(action, Promote):
            break
        standby = claim_standby(t, action.standby)
        if standby is not None:
            break
        # Found dead or stopped (lost, never promoted): decide again without it.
    if action.exclude is not None and g is not None:
        # Before anything is launched: no allocation from now on lands on a suspect node.
        exclude_nodes(t, failure.suspects, g.index, g.attempt, action.exclude)
    if g is not None:
        # Compared with the next attempt's: the same failure at start-up twice is a crash loop.
        g.startup_failure = failure.startup
    if isinstance(action, Promote):
        promote(t, g, action, standby, disk)
    elif isinstance(action, GiveUp):
        give_up(t, g, action)
    elif isinstance(action, FullRestart):
        full_restart(t, g, action)
    elif isinstance(action, StateLost):
        lose_job(t, action.reason)
    elif isinstance(action, Relaunch):
        schedule(t, g, action)


def exclude_nodes(t: Tick, suspects: tuple[NodeSuspect, ...], group: int, attempt: int, keep_off: tuple[str, ...]) -> None:
    """An action's exclusion: record each suspect (``node_excluded``) and keep every allocation
    from now on off ``keep_off``."""
    pool = t.state.nodes
    for s in suspects:
        if pool.exclude(s.node, s.reason, t.now, group, attempt) is not None:
            t.out.emit(EventKind.NODE_EXCLUDED, node=s.node, reason=s.reason, group=group, attempt=attempt, excluded=sorted(pool.excluded))
    if suspects:
        t.out.do(SetNodeExclusions(tuple(sorted(set(keep_off)))))


def promote(t: Tick, g: GroupState, action: Promote, standby: Any, disk: Optional[DiskFact]) -> None:
    """Put the claimed standby in failed group ``g``'s place (live recovery)."""
    decision = resume_point(t, "no_live_peer", t.state.live_peers(g.index), g.index, disk)
    if decision is None or isinstance(decision, StateLost):
        # (None cannot happen: the decision's disk fact was found with the failure's.)
        lose_job(t, decision.reason if decision is not None else "no state to promote a standby with")
        return
    if action.charged:
        count_restart(t, g)
    g.attempt += 1
    decision = with_copy(t, g, decision)
    t.out.do(PromoteStandby(standby.number, g.index, g.attempt, decision, entry=standby))
    g.ranks = []  # the standby's, once promoted (the executor)
    g.move(GroupStatus.STARTING)
    g.launched_at, g.train_done = t.now, False
    g.plan, g.gate, g.gate_decided, g.load_failure = LaunchPlan(), "", True, None
    t.out.emit(EventKind.RESTART_SCHEDULED, group=g.index, restart=g.restarts, backoff_s=0.0, path=action.path, action=action.kind, because=action.reason)
    t.out.emit(EventKind.RECOVERY_PATH, group=g.index, attempt=g.attempt, path=action.path, standby=standby.number)
    t.out.emit(EventKind.STANDBY_PROMOTED, standby=standby.number, group=g.index, attempt=g.attempt, ready_for_s=round(t.now - (standby.ready_at or t.now), 3))
    t.out.emit(EventKind.GROUP_LAUNCHED, group=g.index, attempt=g.attempt, launcher=t.rules.launcher_name, standby=standby.number)
    t.out.emit(EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=t.state.job_step)


def schedule(t: Tick, g: GroupState, action: Relaunch, load_step: Optional[int] = None, start_gate: str = "", load_path: Optional[str] = None) -> None:
    """Relaunch ``g`` after the action's backoff. An uncharged relaunch (a checkpoint that
    failed to load, quarantined: the next attempt tries another step) neither counts against
    the budget nor backs off further."""
    if action.charged:
        count_restart(t, g)
    g.move(GroupStatus.WAITING)
    g.plan = LaunchPlan(t.now + action.backoff_s, load_step, load_path, start_gate)
    t.out.emit(
        EventKind.RESTART_SCHEDULED,
        group=g.index,
        restart=g.restarts,
        backoff_s=round(action.backoff_s, 3),
        action=action.kind,
        because=action.reason,
        **({} if action.charged else {"counted": False}),
    )


def count_restart(t: Tick, g: GroupState) -> None:
    g.restarts += 1
    g.restart_times = t.rules.planner.policy.budget.charge(g.restart_times, t.now)


def full_restart(t: Tick, failed: Optional[GroupState], action: FullRestart) -> None:
    """The whole job stops and resumes from one disk checkpoint.

    The baseline policy (``ft.recovery=full_restart``) on every fault, and the escalation of a
    job-wide stall or an integrity rollback. Every group loads the same step (the newest complete
    one any group wrote; a group without it gets a copy, as from shared storage) and waits at a
    fresh start gate, so the job comes back as one quorum instead of groups healing from each
    other. The groups are stopped now; the step is chosen once the disk has been read
    (:func:`continue_restart`, in this pass or the next)."""
    for g in t.state.groups:
        if g is not failed and g.active:
            t.out.do(StopGroup(g.index, g.attempt, action.trigger, ranks=tuple(g.ranks)))
            # Stopped, not failed: its next start-up failure is not a second one in a row.
            g.startup_failure = None
            g.move(GroupStatus.STOPPED)
    t.state.restart_pending = PendingRestart(failed.index if failed is not None else None, action.trigger, action.charged, action.at_most)
    continue_restart(t)


def continue_restart(t: Tick) -> None:
    """The pending full restart, once its checkpoint step is known: every group not finished
    scheduled to load it at a fresh start gate."""
    state = t.state
    pending = state.restart_pending
    if pending is None:
        return
    decision = resume_point(t, pending.trigger, at_most=pending.at_most)
    if decision is None:
        return  # the disk is read after this pass
    state.restart_pending = None
    if isinstance(decision, StateLost):
        lose_job(t, decision.reason)
        return
    step = decision.step
    state.full_restarts += 1
    state.gate_since = t.now
    t.out.emit(EventKind.FULL_RESTART, failed_group=pending.failed_group, resume_step=step, reason=pending.trigger)
    gate = t.rules.layout.start_gate(state.full_restarts)
    for g in state.groups:
        if g.status == GroupStatus.GIVEN_UP or (g.status == GroupStatus.DONE and g.index != pending.failed_group):
            continue
        g.failure = None
        each = t.rules.planner.reschedule(state, g.index, pending.charged, t.now)
        if isinstance(each, GiveUp):
            give_up(t, g, each)
        else:
            schedule(t, g, each, load_step=step, start_gate=gate, load_path=load_path(t, g.index, step))


def give_up(t: Tick, g: GroupState, action: GiveUp) -> None:
    g.move(GroupStatus.GIVEN_UP)
    g.gave_up = action.why
    if action.why is GiveUpReason.CRASH_LOOP:
        report_crash_loop(t, g)
        return
    budget = t.rules.planner.policy.budget
    t.out.emit(
        EventKind.RESTART_BUDGET_EXHAUSTED,
        group=g.index,
        restarts=g.restarts,
        recent_restarts=budget.recent(g.restart_times, t.now),
        max_restarts=budget.max_restarts,
        restart_window_s=budget.window_s,
        last_error=g.last_error["error"] if g.last_error else None,
    )


def report_crash_loop(t: Tick, g: GroupState) -> None:
    """``g``'s last two launches failed the same way at start-up. One console line per
    distinct failure, with the ranks' own error line: a second group failing the same way
    is named by its event, not by the same line again."""
    failure = g.startup_failure or {}
    first = next(
        (o.index for o in t.state.groups if o is not g and o.gave_up == GiveUpReason.CRASH_LOOP and crash_loop(o.startup_failure, failure)),
        None,
    )
    log_path = t.rules.layout.log(g.index, failure.get("rank") or 0, failure.get("attempt", g.attempt))
    t.out.emit(
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
        t.out.error(crash_loop_line(g.index, failure, log_path))


def lose_job(t: Tick, message: str) -> None:
    """The job's state is gone (no live group, no checkpoint): stop with one clear line,
    the first one said (the job stops at the next tick)."""
    state = t.state
    if state.watch.fatal:
        return
    state.watch.fatal = message
    t.out.emit(EventKind.JOB_STATE_LOST, job_step=state.job_step, message=message)
    t.out.error(message)


# ---------------------------------------------------------------- launches
def launch_due(t: Tick) -> None:
    """Launch every waiting group whose backoff is over."""
    for g in t.state.groups:
        if g.status == GroupStatus.WAITING and t.now >= g.plan.at:
            launch(t, g)


def launch(t: Tick, g: GroupState) -> None:
    """Start ``g``'s next attempt as its plan says: warm or cold, as the planner says; a first
    launch waiting for its host's fork server waits (the next tick asks again)."""
    state, planner, layout = t.state, t.rules.planner, t.rules.layout
    fork = ForkFact(t.rules.fork_problem, server_state(t, g.index), server_exhausted(t, g.index))
    first = None
    if g.attempt < 0:
        first = planner.first_launch(fork, t.now - state.watch.first_wait.setdefault(g.index, t.now))
        if first is None:
            return
    plan = g.plan
    g.attempt += 1
    g.gate = plan.start_gate
    if g.attempt > 0 and not g.gate:
        # A live relaunch: whether it heals from a peer or loads the disk checkpoint is
        # decided when it is ready to join (open_launch_gates), not now: the peers alive at
        # launch may all be gone by then.
        g.gate = layout.launch_gate(g.index, g.attempt)
    g.gate_decided = False
    g.load_failure = None
    g.loading = None if plan.load_step is None else (plan.load_step, plan.load_path or step_dir(layout.checkpoint(g.index), plan.load_step))
    relaunch = planner.launch(state, g.index, fork)
    warm = isinstance(relaunch, WarmFork) or (first is not None and first[0] is RecoveryPath.WARM_FORK)
    t.out.do(
        LaunchGroup(
            g.index,
            g.attempt,
            warm,
            relaunch=relaunch,
            cold_because=first[1] if first is not None else None,
            load_step=plan.load_step,
            load_path=plan.load_path,
            gate=g.gate,
        )
    )
    g.ranks = []  # started by the executor
    g.plan = LaunchPlan()
    g.move(GroupStatus.STARTING)
    g.launched_at, g.train_done = t.now, False


# ---------------------------------------------------------------- where the state comes from
def open_launch_gates(t: Tick) -> None:
    """Tell each live-relaunched group, once all its ranks are ready, where its state comes
    from: a live peer (it heals through TorchFT when it joins the quorum), or, with no group
    left holding the job's state, the newest disk checkpoint (never its initial weights once the
    job has committed steps)."""
    layout = t.rules.layout
    for g in t.state.groups:
        if g.status != GroupStatus.STARTING or g.gate_decided or g.gate != layout.launch_gate(g.index, g.attempt):
            continue
        if not (g.ranks and all(r.model_ready for r in g.ranks)):
            continue
        decision = resume_point(t, "no_live_peer", t.state.live_peers(g.index), g.index)
        if decision is None:
            continue  # the disk is read after this pass
        if isinstance(decision, StateLost):
            lose_job(t, decision.reason)
            return
        decision = with_copy(t, g, decision)
        t.out.do(WriteGate(g.gate, decision))
        g.gate_decided = True
        t.out.emit(EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=t.state.job_step)


def resume_point(
    t: Tick,
    reason: str,
    live_peers: tuple[int, ...] = (),
    group: Optional[int] = None,
    disk: Optional[DiskFact] = None,
    at_most: Optional[int] = None,
) -> Optional[Union[StateDecision, StateLost]]:
    """Where the job's state comes from now, and for a disk checkpoint the rollback recorded;
    :class:`StateLost` names every step tried when none was intact; None: the decision needs the
    newest intact checkpoint (not after ``at_most``: an integrity rollback's), asked for."""
    state = t.state
    if disk is None and needs_disk(live_peers, state.job_step):
        key = state.job_step if at_most is None else min(at_most, state.job_step)
        disk = disk_fact(t, key)
        if disk is None:
            t.out.find_disk(key)
            return None
    decision = t.rules.planner.state_source(state, live_peers, disk)
    if isinstance(decision, StateDecision) and decision.source is StateSource.DISK:
        if decision.steps_lost:
            rollback = {"from_step": state.job_step, "to_step": decision.step, "steps_lost": decision.steps_lost, "reason": reason, "group": group}
            state.rollbacks.append(rollback)
            t.out.emit(EventKind.JOB_ROLLBACK, **rollback)
        state.ledger.rollback(decision.step)
        write_floor(t, force=True)
    return decision


def disk_fact(t: Tick, at_most: int) -> Optional[DiskFact]:
    """The newest intact checkpoint no newer than ``at_most``, if this pass was handed it: found
    for ``at_most`` itself, or for a later step whose newest intact checkpoint is no newer than
    ``at_most`` (a rollback in the same pass lowered the job's step to it); None: to be found."""
    for key, fact in sorted(t.facts.disk.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if key == at_most or ((key is None or key >= at_most) and (fact.step is None or fact.step <= at_most)):
            return fact
    return None


def write_floor(t: Tick, force: bool = False) -> None:
    """Tell the ranks the job's committed step (control/commit_floor) when it changed."""
    watch = t.state.watch
    if force or t.state.job_step != watch.floor_written:
        t.out.do(WriteFloor(t.state.job_step))
        watch.floor_written = t.state.job_step


def load_path(t: Tick, group: int, step: Optional[int]) -> Optional[str]:
    """The step directory ``group`` loads ``step`` from: the copy the last disk recovery made
    loadable for it (its own, or an intact one elsewhere); None: its own folder's."""
    rec = t.state.recovered
    if step is None or rec is None or rec.step != step:
        return None
    return rec.paths.get(t.rules.layout.checkpoint(group))


def with_copy(t: Tick, g: GroupState, decision: StateDecision) -> StateDecision:
    """A DISK decision with the copy ``g`` loads (which it is then told to load: g.loading)."""
    if decision.source is not StateSource.DISK:
        return decision
    path = load_path(t, g.index, decision.step) or step_dir(t.rules.layout.checkpoint(g.index), decision.step)
    g.loading, g.load_failure = (decision.step, path), None
    return decision.at(path)


def checkpoint_unloadable(t: Tick, g: GroupState) -> bool:
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
    t.state.unloadable[int(step)] = error
    layout = t.rules.layout
    owner = next((o.index for o in t.state.groups if path and os.path.dirname(os.path.normpath(path)) == layout.checkpoint(o.index)), g.index)
    t.out.do(Quarantine(owner, int(step), f"failed to load: {error}", by=f"a load by group {g.index} (attempt {g.attempt})", path=path))
    return True


# ---------------------------------------------------------------- silent data corruption (controller.integrity)
def integrity_verdicts(t: Tick) -> None:
    """Act on the integrity verdicts the pass's reports completed, each as a typed failure the
    planner decides on (the ordinary recovery paths); a verdict on an attempt already replaced
    is moot."""
    verdicts, t.verdicts = t.verdicts, []
    for v in verdicts:
        if isinstance(v, Corrupt):
            _corrupt(t, v)
        elif isinstance(v, Diverged):
            _diverged(t, v)
        elif isinstance(v, Suspect):
            g = t.state.groups[v.group]
            if g.attempt == v.attempt and g.active:
                t.out.emit(EventKind.GROUP_SUSPECT, group=v.group, attempt=v.attempt, step=v.step, vetoes=v.vetoes)
                t.rules.judge.condemn({v.group: v.attempt})
                fail_group(t, g, FailureKind.SUSPECT, reason=FailureKind.SUSPECT, step=v.step, vetoes=v.vetoes)


def _corrupt(t: Tick, v: Corrupt) -> None:
    """A minority of replicas disagreed with the majority: each is failed (it heals from a
    majority peer through the normal recovery path), its checkpoints since it last agreed set
    aside, before its failure (a full restart chooses its step after it) and after (a save
    that finished meanwhile)."""
    for group, attempt in sorted(v.blamed.items()):
        g = t.state.groups[group]
        if g.attempt != attempt or not g.active:
            continue
        why = f"saved after group {group} last agreed with its peers (step {v.trusted[group]})"
        t.out.do(QuarantineNewer(group, v.trusted[group], why))
        t.out.emit(
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
        fail_group(t, g, FailureKind.CORRUPT, reason=FailureKind.CORRUPT, step=v.record_step, tensors=list(v.tensors[group]))
        t.out.do(QuarantineNewer(group, v.trusted[group], why))


def _diverged(t: Tick, v: Diverged) -> None:
    """No majority: nobody holds a state known good but the one they last agreed on; the job
    goes back to the newest checkpoint at or before it (the planner's FullRestart) and every
    newer one is set aside."""
    if any(t.state.groups[g].attempt != a for g, a in v.attempts.items()):
        return  # already relaunched since (an earlier verdict)
    t.out.emit(
        EventKind.SDC_DETECTED,
        groups=list(v.groups),
        step=v.record_step,
        state_step=v.step,
        after_veto=v.vetoed,
        tensors=list(v.tensors),
        trusted_step=v.trusted_step,
        action="rollback",
    )
    t.rules.judge.rolled_back(v.trusted_step, dict(v.attempts))
    fail_job(t, FailureKind.DIVERGED, at_most=v.trusted_step)
    for g in t.state.groups:
        t.out.do(QuarantineNewer(g.index, v.trusted_step, f"saved after the replicas last agreed (step {v.trusted_step})"))


# ---------------------------------------------------------------- a takeover, a resume
def lost_while_unsupervised(t: Tick) -> None:
    """The groups a new controller found with a rank gone (``JobState.watch.lost_on_attach``),
    failed once their reports are read (what they did while unsupervised is recorded first). A
    rank that reported its error (``rank_error``) before it died was not lost without a word: it
    failed, most often because a lost peer broke its collectives; named apart, so ``ranks`` are
    the ones that vanished."""
    lost = t.state.watch.lost_on_attach
    for group, ranks in sorted(lost.items()):
        g = t.state.groups[group]
        if not g.active:
            continue
        errored = [rs.rank for rs in g.ranks if rs.error and rs.rank in ranks]
        vanished = [r for r in ranks if r not in errored]
        extra = {"errored_ranks": errored} if errored else {}
        fail_group(t, g, FailureKind.LOST, reason="lost_while_unsupervised", ranks=vanished, **extra)
    lost.clear()


def resume_job(t: Tick, disk: DiskFact) -> None:
    """``checkpoint.resume``: every group loads the newest intact step any group saved (``disk``:
    found and copied where missing), and the job's committed step starts there. Checkpoints on
    disk of which none is intact stop the job (one line naming each), rather than training again
    from the initial weights."""
    state = t.state
    step = disk.step
    if step is None and state.ckpt_health.quarantined:
        lose_job(
            t,
            f"checkpoint.resume=true and no intact disk checkpoint is left: {'; '.join(disk.tried)}; each was moved to its "
            "group folder's quarantine/ (nothing deleted; python -m monarch_ft verify RUN_DIR checks what is on disk)",
        )
        return
    for g in state.groups:
        g.plan = LaunchPlan(g.plan.at, step, load_path(t, g.index, step), g.plan.start_gate)
    if step is not None:
        state.ledger.rollback(step)
    t.out.emit(EventKind.JOB_RESUMED, step=step)
