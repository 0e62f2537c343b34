"""Each tick's judgement of the groups (what was ``watch``): a rank that exited, a group that
finished, a rank that hangs (the hang model: :mod:`monarch_ft.controller.hangs`), a job-wide
stall. A failed group is stopped here (:func:`monarch_ft.controller.decide.recovery.fail_group`);
its recovery is planned once every failure of the tick is known.

Silence counts only while this controller was watching: a controller held up itself (no CPU, a
blocked filesystem) records the window (:func:`account_own_stall`), or every rank would look
silent for that long at once and be killed on waking; a soak lost its whole job that way.
"""

from __future__ import annotations

from typing import Optional

from monarch_ft.controller.actions import ReportStall
from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.decide.recovery import checkpoint_unloadable, fail_group, fail_job
from monarch_ft.controller.hangs import (
    Hang,
    HangLimits,
    RankView,
    asleep_compute_timeout,
    auto_hang_timeout,
    find_hang,
    is_job_stall,
    track_cpu,
    track_os_state,
)
from monarch_ft.controller.state import FailureKind, GroupState, JobState
from monarch_ft.records.events import EventKind, GroupStatus
from monarch_ft.records.exits import RankExit, blamed_exit, describe_exit

# A watch tick this much later than the previous one means the supervisor itself was held up.
SUPERVISOR_STALL_S = 2.0


# ---------------------------------------------------------------- this controller's own stalls
def account_own_stall(t: Tick) -> None:
    """Record a window in which this controller itself was held up (see :func:`watched`)."""
    watch = t.state.watch
    gap = t.now - watch.last_tick if watch.last_tick else 0.0
    if gap > SUPERVISOR_STALL_S:
        watch.blind.append((watch.last_tick, t.now))
        del watch.blind[:-100]
        t.out.emit(EventKind.SUPERVISOR_STALLED, seconds=round(gap, 3))
    watch.last_tick = t.now


def watched(state: JobState, since: float, now: float) -> float:
    """Seconds of [since, now] during which this controller was watching: silence and phase
    time count only then."""
    blind = sum(max(0.0, min(end, now) - max(start, since)) for start, end in state.watch.blind)
    return max(0.0, now - since - blind)


# ---------------------------------------------------------------- exits
def take_exits(t: Tick) -> None:
    """Every rank exit the tick saw, into the state (``rank_exited`` each), before any group is
    judged: two groups that die together are both seen dead before the first one's recovery
    asks which peers hold the job's state."""
    for (group, rank), code in t.obs.exits.items():
        g = t.state.groups[group]
        if not g.active:
            continue  # stopped earlier in the pass (lost while unsupervised): its ranks are killed
        rs = next((r for r in g.ranks if r.rank == rank), None)
        if rs is None or rs.exited is not None:
            continue
        rs.exited = code
        t.out.emit(EventKind.RANK_EXITED, group=g.index, rank=rs.rank, attempt=g.attempt, **describe_exit(code))


def beating_groups(t: Tick, limits: HangLimits) -> set[int]:
    """The active groups with a rank heard from within the suspicion's silence: once per tick (a
    rank silent and asleep is frozen by itself only while ranks elsewhere beat)."""
    state, now, silence = t.state, t.now, limits.suspect_silence_s
    # now - last_progress bounds the watched time from above (watched leaves the blind windows
    # out): heard from within the silence by the clock is heard from within it watched, and
    # only the others need the windows summed (a thousand ranks a tick).
    return {
        g.index
        for g in state.groups
        if g.active and any(rs.exited is None and (now - rs.last_progress < silence or watched(state, rs.last_progress, now) < silence) for rs in g.ranks)
    }


def judge_group(t: Tick, g: GroupState, limits: HangLimits, beating: set[int]) -> Optional[Hang]:
    """A rank that exited non-zero fails its group at once (:func:`~monarch_ft.records.exits.blamed_exit`
    names which); every rank exited 0: the group is done; else a silent rank is returned as a
    hang verdict for :func:`judge_hangs`, which looks at every group's before acting (``limits``:
    the hang model's bounds this tick, :func:`hang_limits`; ``beating``: :func:`beating_groups`).

    A group whose ranks were not sampled this tick (past observe.SAMPLED_GROUPS_PER_TICK groups,
    each is sampled in turn) is judged on its last verdict, kept while none of its ranks has been
    heard from since: a job-wide stall is still every group hung at once."""
    blamed = blamed_exit([(rs.rank, rs.exited) for rs in g.ranks if rs.exited])
    if blamed is not None:
        failure = {"reason": "exit", "rank": blamed[0], **describe_exit(blamed[1])}
        error = g.error()
        details = {**failure, **({"error": error["error"], "error_rank": error["rank"]} if error else {})}
        # The checkpoint failed, not the group: its relaunch (at the next older step, or healed
        # by a peer) does not count against its restart budget.
        load_failed = blamed[1] == RankExit.CHECKPOINT_LOAD_FAILED and checkpoint_unloadable(t, g)
        fail_group(t, g, FailureKind.LOAD_FAILED if load_failed else FailureKind.EXIT, **details)
        return None
    if g.ranks and all(r.exited == 0 for r in g.ranks):
        g.move(GroupStatus.DONE)
        t.out.emit(EventKind.GROUP_FINISHED, group=g.index, attempt=g.attempt, step=g.last_step)
        return None
    live = [rs for rs in g.ranks if rs.exited is None]
    state, now, ft = t.state, t.now, t.cfg.ft
    kept = state.watch.hangs_seen
    if t.obs.sampled is not None and g.index not in t.obs.sampled:
        seen = kept.get(g.index)
        if seen is None:
            return None
        at, attempt, hang = seen
        if attempt != g.attempt or any(rs.last_progress > at for rs in live):
            del kept[g.index]
            return None
        return hang
    started = all(r.first_step_seen or r.train_done for r in g.ranks)
    # Every tick: a state held for ft.os_stall_s needs every sample in between to see it.
    for rs in live:
        sample = t.obs.samples.get((g.index, rs.rank))
        os_state, cpu_s = (sample.os_state, sample.cpu_s) if sample is not None else (None, None)
        rs.os_sample = track_os_state(rs.os_sample, os_state, now, ft.os_stall_s)
        rs.cpu_sample = track_cpu(rs.cpu_sample, cpu_s, now)
    views = [
        RankView(
            rank=rs.rank,
            silent_s=watched(state, rs.last_progress, now),
            started=started,
            phase=rs.phase,
            phase_s=watched(state, rs.phase_seen, now) if rs.phase else 0.0,
            os_state=rs.os_sample.state,
            os_state_s=rs.os_sample.held_s,
            finished=rs.train_done,
            asleep_s=rs.cpu_sample.asleep_s if rs.cpu_sample else None,
        )
        for rs in live
    ]
    # A rank of this group silent and asleep is frozen by itself only while ranks elsewhere beat.
    hang = find_hang(views, limits, bool(beating - {g.index}))
    state.watch.judged_at[g.index] = now
    if hang is None:
        kept.pop(g.index, None)
    else:
        kept[g.index] = (now, g.attempt, hang)
    return hang


# ---------------------------------------------------------------- hangs
def hang_timeout_s(t: Tick) -> float:
    """The hang timeout now: ``ft.hang_timeout_s`` if a number, else the learned one
    (max(ft.hang_min_s, ft.hang_step_factor x p99 of recent compute seconds per step))."""
    if t.rules.hang_timeout_fixed is not None:
        return t.rules.hang_timeout_fixed
    ft = t.cfg.ft
    return auto_hang_timeout(list(t.state.step_times.samples), ft.hang_min_s, ft.hang_step_factor, fallback_s=15.0)


def hang_limits(t: Tick) -> HangLimits:
    """The hang model's bounds, from the config and what was learned: the one place the
    timeouts are composed (a sync's own bound: ``ft.sync_budget_s``)."""
    ft = t.cfg.ft
    return HangLimits(
        hang_timeout_s(t),
        ft.startup_timeout_s,
        t.cfg.checkpoint.save_timeout_s,
        ft.sync_budget_s,
        os_stall_s=ft.os_stall_s,
        asleep_s=ft.asleep_s,
        asleep_compute_s=asleep_compute_timeout(t.state.step_times.p99(), ft.asleep_s, t.rules.compute_on_cpu),
    )


def judge_hangs(t: Tick, hangs: dict[int, Hang]) -> None:
    """Act on this tick's hang verdicts, all groups together.

    - Every stepping group silent and none stuck by itself: one job-wide stall. Capture
      every rank's stacks and wait ``ft.stall_timeout_s``; if it does not clear, resume
      the whole job from the newest checkpoint. The detector never kills the groups that
      hold the job's state one by one.
    - Some culprit stuck by itself (stopped, zombie, ...): fail only those groups; the
      others are most likely blocked on them and step again once they are gone.
    - Otherwise fail each hung group (stacks captured first).
    """
    state, now = t.state, t.now
    stepping = [g.index for g in state.groups if g.status == GroupStatus.RUNNING]
    if hangs and t.obs.sampled is not None:
        # A share of the groups judged a tick: act once every stepping group has been judged
        # since the oldest verdict (a period later at most), or the first groups found silent
        # in a job-wide stall would be failed one by one before the last were judged.
        oldest = min(state.watch.hangs_seen[i][0] for i in hangs)
        if any(state.watch.judged_at.get(g, float("-inf")) < oldest for g in stepping):
            return
    stalled = is_job_stall(hangs, stepping)
    if state.stall_since is not None and not stalled:
        # Groups come out of a shared stall a beat apart (phases are reported once a
        # second): the rest get one more hang timeout before they count as hung alone.
        t.out.emit(EventKind.JOB_STALL_CLEARED, lasted_s=round(now - state.stall_since, 2))
        state.stall_since = None
        state.stall_grace_until = now + hang_timeout_s(t)
    if now < state.stall_grace_until:
        hangs = {i: h for i, h in hangs.items() if h.self_explained}
    if not hangs:
        return
    if stalled:
        if state.stall_since is None:
            state.stall_since = now
            t.out.do(ReportStall(tuple(sorted(hangs)), dict(hangs), t.cfg.ft.stall_timeout_s))
        elif now - state.stall_since > t.cfg.ft.stall_timeout_s:
            t.out.emit(EventKind.JOB_STALL_ESCALATED, groups=sorted(hangs), lasted_s=round(now - state.stall_since, 2))
            state.stall_since = None
            fail_job(t, FailureKind.STALL)
        return
    explained = {i: h for i, h in hangs.items() if h.self_explained}
    for i, h in sorted((explained or hangs).items()):
        g = state.groups[i]
        fail_group(
            t,
            g,
            FailureKind.HUNG,
            stacks_tag=f"hang-g{i}",
            time=now,  # the verdict's tick: the stacks are captured after it
            reason="hung",
            rank=h.rank,
            blame=h.reason,
            silent_s=h.silent_s,
            process_status=h.os_state,
            process_status_s=h.os_state_s,
            asleep_s=h.asleep_s,
            rank_status={str(r): st for r, st in h.rank_states.items()},
            phase=h.phase,
            phase_s=h.phase_s,
            hang_timeout_s=round(hang_timeout_s(t), 3),
        )
