"""The ranks' new report records, taken into the job's state (what was ``relay``).

Every record a tick read (:class:`~monarch_ft.controller.observe.Observations`, typed by
:mod:`monarch_ft.records.report_records`) updates what the controller knows of its rank and
group (steps, phases, errors, readiness), advances the job's committed step
(:class:`~monarch_ft.controller.ledger.CommitLedger`), and is relayed: steps to ``metrics.jsonl``,
the ranks' events to ``events.jsonl`` (with the peer a healing rank named, by group). State
fingerprints and gradient votes go to the integrity checks; the verdicts they complete are
acted on later in the same pass (:mod:`.recovery`).
"""

from __future__ import annotations


from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.ledger import redone_commit
from monarch_ft.controller.state import GroupState, RankState
from monarch_ft.records.events import EventKind, GroupStatus
from monarch_ft.records.members import members_field
from monarch_ft.records.report_records import Heartbeat, Liveness, RankEvent, ReportRecord, StepRecord

# Commits kept for the redone-step check and the consistency check: this many steps back.
HASHES_KEPT = 200

# What a group's newest commit keeps of its rank 0's record (``state.last_commit``: what hooks,
# the Prometheus endpoint and the outage accounting read). The whole record was kept before, and
# the takeover save diffed every field of it for every group at every step: a third of the
# save's CPU at 1,024 groups.
COMMIT_FIELDS = ("step", "time", "attempt", "quorum_id", "quorum_size", "participating_groups", "loss")


def absorb_reports(t: Tick) -> None:
    """Every active group's new records, group by group, each rank's in file order."""
    for g in t.state.groups:
        records = t.obs.reports.get(g.index)
        if records:
            absorb_group(t, g, records)


def absorb_group(t: Tick, g: GroupState, records: list[tuple[int, ReportRecord]]) -> None:
    """``g``'s new records (rank, record), in order."""
    ranks = g.ranks
    metrics: list[StepRecord] = []
    for rank, rec in records:
        # Ranks are kept in rank order: a dict of them built per group per tick cost more than the lookups.
        rs = ranks[rank] if 0 <= rank < len(ranks) and ranks[rank].launch.rank == rank else next((r for r in ranks if r.launch.rank == rank), None)
        if rs is None:
            continue
        if isinstance(rec, StepRecord):
            _step(t, g, rs, rec, metrics)
        elif isinstance(rec, Heartbeat):
            rs.last_progress = t.now
        elif isinstance(rec, Liveness):
            rs.last_progress = t.now
            if (rec.phase, rec.phase_since) != (rs.phase, rs.phase_since):
                rs.phase, rs.phase_since = rec.phase, rec.phase_since
                rs.phase_seen = min(t.now, rec.phase_since or t.now)
        elif isinstance(rec, RankEvent):
            if metrics:
                # Steps before an event stay before it in the files (metrics, then the event).
                t.out.relay_steps(metrics)
                metrics = []
            _event(t, g, rs, rec)
    if metrics:
        t.out.relay_steps(metrics)
    if g.ranks and all(r.train_done for r in g.ranks) and not g.train_done:
        g.train_done = True
        if g.status == GroupStatus.STARTING:
            g.move(GroupStatus.RUNNING)


def _step(t: Tick, g: GroupState, rs: RankState, rec: StepRecord, metrics: list[StepRecord]) -> None:
    state = t.state
    # The record's fields read once (its properties convert on every read; a thousand records a tick).
    raw, step, committed, lead = rec.raw, rec.step, rec.committed, rec.rank == 0
    rs.last_progress, rs.last_step = t.now, step
    if not rs.first_step_seen:
        rs.first_step_seen = True
    t.steps_seen = True
    state.step_times.observe(raw)
    state.stragglers.observe(raw, t.cfg.ft.straggler_window)
    if state.first_step_time is None:
        state.first_step_time = t.now
    if not rec.relayed:
        metrics.append(rec)
    if committed:
        g.last_step = max(g.last_step, step + 1)
        _record_commit(t, g, rec)
    loss = rec.loss if lead else None
    if loss is not None:
        if g.first_loss is None:
            g.first_loss = loss
        g.last_loss = loss
    if lead and committed:
        state.last_commit[g.index] = {k: raw[k] for k in COMMIT_FIELDS if k in raw}
    # Fingerprints and gradient votes; the verdicts are acted on once per pass.
    t.verdicts += t.rules.judge.observe(g.index, raw)
    if g.status == GroupStatus.STARTING:
        g.move(GroupStatus.RUNNING)
        t.out.emit(EventKind.GROUP_STEPPING, group=g.index, attempt=g.attempt, step=step)
    if lead and committed:
        _track_membership(t, rec)


def _event(t: Tick, g: GroupState, rs: RankState, rec: RankEvent) -> None:
    state = t.state
    rs.last_progress = t.now
    fields = dict(rec.raw)
    kind = rec.kind
    if kind == EventKind.TRAIN_DONE:
        rs.train_done = True
    elif kind == EventKind.RANK_FINISHED:
        rs.state_hash = fields.get("state_hash")
        # A group healed while the others held the job open trained no step of its own at
        # the end, yet holds the weights of every step.
        g.last_step = max(g.last_step, fields.get("steps_trained", -1))
    elif kind == EventKind.MODEL_READY:
        rs.model_ready = True
        rs.link_probe = fields.get("link_probe")
        state.transport_owner[fields.get("transport_metadata")] = (fields["group"], fields["rank"])
        state.watch.owners_set += 1
        names = fields.pop("fingerprint_names", None)  # long: kept out of events.jsonl
        t.rules.judge.tensor_names(fields["rank"], names)
    elif kind in (EventKind.WEIGHTS_RECOVERED, EventKind.RECOVERY_STARTED, EventKind.RECOVERY_FAILED):
        # Name the peer by group: the Manager only knows its address.
        fields["src_group"], fields["src_rank"] = state.transport_owner.get(fields.get("src"), (None, None))
    elif kind == EventKind.CHECKPOINT_LOAD_FAILED and g.load_failure is None:
        g.load_failure = dict(fields)
    elif kind == EventKind.RANK_ERROR:
        rs.error = dict(fields)
    record = fields if rec.relayed else t.out.relay(kind, **fields)
    state.ckpt_health.observe({"event": str(kind), **record, "time": record.get("time") or t.now})


def _record_commit(t: Tick, g: GroupState, rec: StepRecord) -> None:
    """Advance the job's committed step; a commit that went back (controller.ledger.CommitLedger)
    is a regression, named loudly. Ranks refuse such commits (rank.components.ft.CommitFloor):
    this is the second line."""
    state = t.state
    step = rec.step
    behind = state.ledger.record(step, rec.quorum_id)
    if behind is not None:
        regression = {"group": g.index, "rank": rec.rank, "attempt": rec.attempt, "step": step, "job_committed": behind}
        state.regressions.append(regression)
        t.out.emit(EventKind.STEP_REGRESSION, **regression)
    if rec.state_hash:
        state.step_hashes.setdefault(step, {})[(g.index, rec.rank)] = rec.state_hash
        quorum = rec.quorum_id
        other = redone_commit(state.commit_hashes.setdefault((step, rec.rank), {}), quorum, g.index, rec.state_hash)
        earlier, later = sorted(({"quorum_id": quorum, "group": g.index}, other), key=lambda c: c["quorum_id"]) if other is not None else (None, None)
        if later is not None and (step, later["quorum_id"]) not in state.redone_seen:
            state.redone_seen.add((step, later["quorum_id"]))
            redo = {"step": step, "group": later["group"], "quorum_id": later["quorum_id"], "earlier": earlier}
            state.steps_redone.append(redo)
            t.out.emit(EventKind.STEP_REDONE, **redo)
        # Pruned once per step the hashes move past, not once per record (every group commits
        # each step: a prune per record was groups x kept steps of work a step).
        if step - HASHES_KEPT > state.watch.hashes_pruned_below:
            state.watch.hashes_pruned_below = step - HASHES_KEPT
            for old in [s for s in state.step_hashes if s < step - HASHES_KEPT]:
                del state.step_hashes[old]
            for key in [k for k in state.commit_hashes if k[0] < step - HASHES_KEPT]:
                del state.commit_hashes[key]


def _track_membership(t: Tick, rec: StepRecord) -> None:
    """The quorum's members, from a rank 0's commit of the newest committed step (the job's step less
    one, after :func:`_record_commit` took this one in). An older commit names an older
    quorum's members: a tick reads group after group, each group's records of steps s and s+1,
    and where the quorum changed between them, taking every commit in turn made the
    membership flap twice per group (2,046 ``quorum_change`` events for one change at 1,024
    groups, each encoding the members again)."""
    if rec.step + 1 < t.state.job_step:
        return
    members = rec.participating_groups
    if members is t.state.membership or members == t.state.membership:
        return
    t.state.membership = members
    raw = rec.raw
    t.out.emit(
        EventKind.QUORUM_CHANGE,
        participating_groups=members_field(members),
        quorum_size=raw.get("quorum_size"),
        quorum_id=raw.get("quorum_id"),
        step=rec.step,
        seen_by=rec.group,
    )


def consistent_at(state, ranks_per_group: int, groups: set[int], min_step: int):
    """(step, equal) for the first step >= ``min_step`` that every rank of ``groups``
    hashed: whether every rank index holds the same state in each of them; None if no
    such step was reported yet."""
    ranks = range(ranks_per_group)
    hashes = state.step_hashes
    for step in sorted(s for s in hashes if s >= min_step):
        seen = hashes[step]
        if all((grp, r) in seen for grp in groups for r in ranks):
            return step, all(len({seen[(grp, r)] for grp in groups}) == 1 for r in ranks)
    return None
