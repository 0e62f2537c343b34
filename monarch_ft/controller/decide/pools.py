"""The standby pool and the fork servers, decided (their I/O is the executor's).

Standbys (:mod:`monarch_ft.controller.standby_pool`): a standby is ready once every rank of it
reported ``standby_ready``; lost when a rank exited (or, when it is claimed, is stopped or a
zombie); one is launched for each missing once the job trains. Fork servers
(:mod:`monarch_ft.controller.fork_pool`): one per host a group runs on, its readiness and its
loss written once each, a lost one restarted unless it keeps dying before it is ready.
"""

from __future__ import annotations

from typing import Optional

from monarch_ft.controller.actions import CloseForkServer, LaunchStandby, LoseStandby, StartForkServer
from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.fork_pool import MAX_FAILED_STARTS, ServerState
from monarch_ft.controller.standby_pool import MAX_FAILED_BUILDS, Standby, standby_loss, standbys_to_launch
from monarch_ft.records.events import EventKind, StandbyStatus
from monarch_ft.records.report_records import RankEvent

# ---------------------------------------------------------------- standbys


def standby_reports(t: Tick) -> None:
    """The standbys' new records and exits: which became ready, which were lost."""
    pool = t.state.standby
    for sb in list(pool.standbys):
        for rank, rec in t.obs.standby_reports.get(sb.number, ()):
            if isinstance(rec, RankEvent) and rec.kind == EventKind.STANDBY_READY:
                sb.ready_ranks.add(rec.get("rank", rank))
        for rs in sb.ranks:
            code = t.obs.standby_exits.get((sb.number, rs.rank))
            if rs.exited is None and code is not None:
                rs.exited = code
        reason = standby_loss([rs.exited for rs in sb.ranks])
        if reason is not None:
            lose_standby(t, sb, reason)
            continue
        if sb.status == StandbyStatus.BUILDING and sb.ranks and len(sb.ready_ranks) == len(sb.ranks):
            sb.status, sb.ready_at = StandbyStatus.READY, t.now
            pool.failed_builds = 0
            pool.ready_s.append(t.now - sb.launched_at)
            t.out.emit(EventKind.STANDBY_READY, standby=sb.number, slot=sb.slot, build_s=round(t.now - sb.launched_at, 3))


def lose_standby(t: Tick, sb: Standby, reason: str) -> None:
    """``sb`` can no longer take over: stopped (its ranks killed) and counted lost."""
    pool = t.state.standby
    pool.failed_builds = 0 if sb.ready_at is not None else pool.failed_builds + 1
    sb.status = StandbyStatus.LOST
    pool.standbys.remove(sb)
    pool.lost += 1
    t.out.do(LoseStandby(sb.number, reason, sb.ready_at is not None, pool.failed_builds < MAX_FAILED_BUILDS, ranks=tuple(sb.ranks)))


def ready_standbys(t: Tick) -> list[int]:
    """The ready standbys' numbers, the longest ready first."""
    return t.state.standby.ready_numbers()


def claim_standby(t: Tick, number: int) -> Optional[Standby]:
    """Standby ``number``, taken out of the pool (its ranks are a group's from now on) if it is
    ready, alive and runnable as the tick saw it; a dead or stopped one found here is lost, never
    promoted."""
    pool = t.state.standby
    sb = next((s for s in pool.ready() if s.number == number), None)
    if sb is None:
        return None
    reason = standby_loss([rs.exited for rs in sb.ranks], [t.obs.standby_os.get((sb.number, rs.rank)) for rs in sb.ranks])
    if reason is not None:
        lose_standby(t, sb, reason)
        return None
    sb.status = StandbyStatus.PROMOTED
    pool.standbys.remove(sb)
    pool.promoted += 1
    pool.clock.update(t.now, len(pool.ready()), True)
    return sb


def launch_standbys(t: Tick) -> None:
    """Launch the standbys missing (none before the job trains, none once it is finishing),
    and run the clock of time without a ready one."""
    state = t.state
    pool = state.standby
    training_started = state.first_step_time is not None
    finishing = all(g.train_done or g.finished for g in state.groups)
    for _ in range(standbys_to_launch(pool.wanted, len(pool.standbys), training_started, finishing, pool.failed_builds)):
        number = pool.first_number + pool.launched_here
        pool.launched_here += 1
        pool.launched += 1
        sb = Standby(number, pool.first_slot + number - pool.first_number, [], t.now)
        pool.standbys.append(sb)
        t.out.do(LaunchStandby(number, sb.slot))
    pool.clock.update(t.now, len(pool.ready()), training_started and not finishing)


# ---------------------------------------------------------------- fork servers
def server_state(t: Tick, group: int) -> Optional[ServerState]:
    """The state of the fork server on ``group``'s host as the tick saw it (None: none, or dead)."""
    key = t.obs.fork_hosts.get(group)
    seen = t.obs.forks.get(key) if key is not None else None
    return seen.state if seen is not None and seen.alive else None


def server_exhausted(t: Tick, group: int) -> bool:
    """No server is started on ``group``'s host any more (it died before it was ready
    MAX_FAILED_STARTS times in a row)."""
    key = t.obs.fork_hosts.get(group)
    return key is not None and t.state.forks.failed_starts.get(key, 0) >= MAX_FAILED_STARTS


def fork_servers(t: Tick) -> None:
    """Write each server's readiness and loss once, close a lost one, and keep one server on the
    host of every unfinished group (unless that host's servers keep dying before ready)."""
    if not t.rules.forks_enabled:
        return
    forks = t.state.forks
    present = set()
    for key, seen in t.obs.forks.items():
        if seen.state is ServerState.READY and seen.pid not in forks.announced:
            forks.announced.add(seen.pid)
            forks.failed_starts[key] = 0
            t.out.emit(EventKind.FORK_SERVER_READY, host=key, pid=seen.pid, **{k: v for k, v in seen.ready_info.items() if k != "pid"})
        if not seen.alive:
            was_ready = seen.pid in forks.announced
            t.out.emit(EventKind.FORK_SERVER_LOST, host=key, pid=seen.pid, exit_code=seen.exit_code, was_ready=was_ready, log=seen.log_path)
            if not was_ready:
                forks.failed_starts[key] = forks.failed_starts.get(key, 0) + 1
            t.out.do(CloseForkServer(key))
            continue
        present.add(key)
    for g in t.state.groups:
        if g.finished:
            continue
        key = t.obs.fork_hosts.get(g.index)
        if key is None or key in present or forks.failed_starts.get(key, 0) >= MAX_FAILED_STARTS:
            continue
        n = forks.starts.get(key, 0)
        forks.starts[key] = n + 1
        present.add(key)
        t.out.do(StartForkServer(g.index, key, n))
