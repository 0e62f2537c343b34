"""The job's own decisions each tick, apart from its groups' failures: the controller asked to
stop or detach, the Lighthouse lost, a cluster's nodes, the gates and the hold, the commit floor,
the transport peers, the integrity interval and scrub, a ``stop`` command, and the job's end."""

from __future__ import annotations

from typing import Optional

from monarch_ft.controller.actions import (
    EndJob,
    OpenStartGate,
    Quarantine,
    RefuseDetach,
    ReplanPending,
    RequestFinish,
    RestartLighthouse,
    SetHold,
    SetNodeExclusions,
    WriteIntegrityEvery,
    WriteTransportPeers,
)
from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.gates import start_gate_opens
from monarch_ft.controller.state import LighthouseOutage
from monarch_ft.controller.summary import job_outcome
from monarch_ft.controller.takeover import DETACHED_EXIT
from monarch_ft.records.events import EventKind, GroupStatus, JobStatus
from monarch_ft.records.lease import controller_finish_margin
from monarch_ft.records.manifest import step_dir


def controller_ends(t: Tick) -> bool:
    """The controller was asked to stop (a signal), the job's state is lost, or a detach was
    asked for: the job ends now (``EndJob``); True when it does."""
    state = t.state
    if t.obs.stop_signal:
        state.status = JobStatus.INTERRUPTED
        t.out.emit(EventKind.SUPERVISOR_STOP_REQUESTED, reason=t.obs.stop_signal)
        t.out.do(EndJob(JobStatus.INTERRUPTED, 130 if t.obs.stop_signal == "SIGINT" else 143, immediate=True))
        return True
    if state.watch.fatal:
        state.status = JobStatus.FAILED
        t.out.do(EndJob(JobStatus.FAILED, 1, immediate=True))
        return True
    if t.obs.detach_requested:
        if t.rules.adoption_problem:
            # Where no new controller could take the job over, a detach is refused (one line).
            t.out.error(f"cannot detach: {t.rules.adoption_problem}")
            t.out.do(RefuseDetach())
            return False
        state.status = JobStatus.DETACHED
        t.out.do(EndJob(JobStatus.DETACHED, DETACHED_EXIT, immediate=True))
        return True
    return False


def job_ended(t: Tick) -> None:
    """Every group done or given up: the job ends, as they ended."""
    state = t.state
    if state.all_finished():
        state.status = job_outcome([g.status for g in state.groups], bool(state.regressions))
        t.out.do(EndJob(state.status, 0 if state.status == JobStatus.COMPLETED else 1))


# ---------------------------------------------------------------- the Lighthouse
def lighthouse(t: Tick) -> None:
    """The Lighthouse died: start it again on the same address, its epoch moved on (the ranks'
    quorum ids move to a new range before the new one answers their retried quorums). The
    ranks' Managers keep their groups meanwhile (see docs/design/lighthouse.md);
    ``lighthouse_recovered`` records the survivors' stall, from the last commit before the loss
    to the first one after it."""
    state = t.state
    if t.obs.lighthouse_alive:
        return
    last = max((r["time"] for r in state.last_commit.values()), default=None)
    state.lighthouse.epoch += 1
    state.lighthouse.outage = LighthouseOutage(t.now, last, state.job_step)
    t.out.do(RestartLighthouse(state.lighthouse.epoch))


def lighthouse_recovered(t: Tick) -> None:
    state = t.state
    outage = state.lighthouse.outage
    if outage is None:
        return
    after = [r["time"] for r in state.last_commit.values() if r["time"] > outage.lost]
    if after:
        first = min(after)
        t.out.emit(
            EventKind.LIGHTHOUSE_RECOVERED,
            stall_s=round(first - (outage.last_commit or outage.lost), 3),
            job_step_before=outage.job_step,
            job_step=state.job_step,
        )
        state.lighthouse.outage = None


# ---------------------------------------------------------------- a cluster's nodes
def nodes(t: Tick) -> None:
    """New placements and node states to the event log; excluded nodes back in the pool released
    (every tick while a node is out: a probation ends with no change of state)."""
    pool = t.state.nodes
    for placed in t.obs.placements:
        pool.placements += 1
        t.out.emit(EventKind.GROUP_PLACED, **placed)
    states = t.obs.node_states
    if not states:
        return
    health = t.rules.node_health
    if states != pool.states:
        for node, st in sorted(states.items()):
            previous = pool.states.get(node)
            if st != previous:
                t.out.emit(EventKind.NODE_STATE, node=node, state=st, health=health(st), previous=previous)
        pool.states = dict(states)
    if not pool.excluded:
        return
    returned = pool.observe({node: health(st) for node, st in states.items()}, t.now)
    for back in returned:
        t.out.emit(EventKind.NODE_RETURNED, node=back.node, reason=back.reason, excluded_s=back.excluded_s)
    if returned:
        t.out.do(SetNodeExclusions(tuple(sorted(pool.to_exclude(pool.states)))))


def replan_pending(t: Tick) -> None:
    """An allocation the scheduler holds pending keeps off the nodes excluded when it was
    submitted; when the exclusions changed since (a node returned, another failed), it is given
    the current ones, through the scheduler's own command: else a standby submitted while two
    failed nodes were out waits for them both forever, though one came back. Once per change."""
    pool = t.state.nodes
    if not t.obs.pending:
        pool.replans.clear()
        return
    now_out = tuple(sorted(pool.to_exclude(pool.states))) if pool.excluded else ()
    for job_id, kept_off in sorted(t.obs.pending.items()):
        if set(kept_off) == set(now_out) or pool.replans.get(job_id) == now_out:
            continue
        pool.replans[job_id] = now_out
        t.out.do(ReplanPending(job_id, now_out))
        t.out.emit(EventKind.ALLOCATION_REPLANNED, job_id=job_id, excluded_before=list(kept_off), excluded=list(now_out))
    for job_id in [j for j in pool.replans if j not in t.obs.pending]:
        del pool.replans[job_id]


# ---------------------------------------------------------------- gates and control files
def open_start_gate(t: Tick) -> None:
    """Let the groups at the current shared gate train once all of them have built their model
    and loaded their state (or once they waited ``ft.startup_timeout_s``)."""
    state = t.state
    gate = t.rules.layout.start_gate(state.full_restarts)
    if t.obs.control.start_gate_open or state.watch.gate_opened == gate:
        return
    # The groups launched to wait at it, and those scheduled to (a full restart's relaunches
    # still in their backoff): the job comes back as one quorum, not group by group.
    waiting = [g for g in state.groups if not g.finished and (g.gate == gate or (g.status == GroupStatus.WAITING and g.plan.start_gate == gate))]
    ready = all(g.active and all(r.model_ready for r in g.ranks) for g in waiting)
    if start_gate_opens(ready, t.now - state.gate_since, t.cfg.ft.startup_timeout_s):
        state.watch.gate_opened = gate
        t.out.do(OpenStartGate(gate))
        t.out.emit(EventKind.TRAINING_STARTED, all_groups_ready=ready, full_restarts=state.full_restarts)


def hold(t: Tick) -> None:
    """Groups that finished wait (serving quorums) while any other group still has work."""
    pending = any(not g.finished and not g.train_done for g in t.state.groups)
    if pending != t.obs.control.hold:
        t.out.do(SetHold(pending))


def stop_command(t: Tick) -> None:
    """``python -m monarch_ft stop``: every group finishes at one step just ahead, saves its
    checkpoint there and exits 0 (what the ranks do by themselves with no controller); once."""
    state = t.state
    if not state.stop_seen and t.obs.control.stop_request:
        state.stop_seen = True
        t.out.do(RequestFinish(state.job_step + controller_finish_margin(state.step_times.median()), "stop_command"))


def transport_peers(t: Tick) -> None:
    """Where each stepping group's ranks serve their state (RunLayout.transport_peers), when it
    changed: a healing rank fetches a chunk that failed its checksum again from another."""
    state = t.state
    running = tuple(g.index for g in state.groups if g.status == GroupStatus.RUNNING)
    made_from = (running, state.watch.owners_set)
    if made_from == state.watch.peers_made_from:
        return  # nothing they are made from changed: the map of every group is not made again each tick
    state.watch.peers_made_from = made_from
    newest: dict[tuple[int, int], str] = {}
    for metadata, owner in state.transport_owner.items():
        if metadata:
            newest[owner] = metadata
    ranks = range(t.cfg.ft.ranks_per_group)
    peers = {str(g): {str(r): newest[(g, r)] for r in ranks if (g, r) in newest} for g in running}
    if peers != state.watch.peers_published:
        t.out.do(WriteTransportPeers(peers))
        state.watch.peers_published = peers


# ---------------------------------------------------------------- silent data corruption (controller.integrity)
def integrity_interval(t: Tick) -> None:
    """auto's interval, once decided: written for the ranks."""
    decided = t.rules.judge.interval()
    if decided is not None:
        every, why, cost = decided
        t.out.do(WriteIntegrityEvery(every))
        t.out.emit(EventKind.INTEGRITY_INTERVAL, every=every, cost_per_step=round(cost, 5), why=why)


def scrubbed(t: Tick) -> None:
    """The checkpoint scrub's finished passes: each damaged copy quarantined."""
    layout = t.rules.layout
    for found in t.obs.scrub:
        if found["damaged"]:
            t.out.emit(EventKind.CHECKPOINT_SCRUBBED, steps=found["steps"], seconds=found["seconds"], damaged=len(found["damaged"]))
        for d in found["damaged"]:
            group: Optional[int] = next((g.index for g in t.state.groups if layout.checkpoint(g.index) == d["folder"]), None)
            if group is not None:
                t.out.do(Quarantine(group, d["step"], d["problem"], "the checkpoint scrub", path=step_dir(d["folder"], d["step"]), only_if_present=True))
