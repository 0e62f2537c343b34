"""The ranks' reports, read into the job's state and relayed: every tick, each live rank's
new records (:class:`~monarch_ft.records.reports.ReportTail`) update what the controller knows
of it and its group (steps, phases, errors, readiness), advance the job's committed step
(:class:`~monarch_ft.controller.ledger.CommitLedger`), and go on to ``metrics.jsonl`` (steps)
and ``events.jsonl`` (the ranks' events, with the peer a healing rank named by group). The
state fingerprints and gradient votes in the step records go to the integrity checks
(:class:`~monarch_ft.controller.integrity.IntegrityJudge`); the verdicts they complete wait in
:meth:`ReportRelay.take_verdicts` for the loop to act on (:mod:`.recovery`)."""

from __future__ import annotations

import json
from typing import IO, Optional

from monarch_ft.controller.integrity import IntegrityJudge, Verdict
from monarch_ft.controller.ledger import redone_commit
from monarch_ft.controller.state import GroupState, JobState
from monarch_ft.records.events import EventKind, EventLog, GroupStatus

# Commits kept for the redone-step check and the consistency check: this many steps back.
HASHES_KEPT = 200


class ReportRelay:
    """Reads the ranks' reports into ``state``.

    Args:
        state: the job's state.
        events: the event log (the ranks' events are relayed into it).
        metrics: ``metrics.jsonl``, open for appending (every step record goes there).
        ranks_per_group: ``ft.ranks_per_group``.
        judge: the integrity checks (None: none; its state is ``state.integrity``).
        straggler_window: ``ft.straggler_window`` (the steps kept per group for the straggler detector).
    """

    def __init__(
        self, state: JobState, events: EventLog, metrics: IO[str], ranks_per_group: int, judge: Optional[IntegrityJudge] = None, straggler_window: int = 10
    ) -> None:
        self.state = state
        self.straggler_window = straggler_window
        self.events = events
        self.metrics = metrics
        self.ranks_per_group = ranks_per_group
        self.judge = judge
        self._verdicts: list[Verdict] = []

    def take_verdicts(self) -> list[Verdict]:
        """The integrity verdicts the records read since the last call completed."""
        verdicts, self._verdicts = self._verdicts, []
        return verdicts

    def consume(self, g: GroupState, now: float) -> None:
        """Read every new record of ``g``'s ranks."""
        state = self.state
        for rs in g.ranks:
            for rec in rs.tail.read():
                kind = rec.get("type")
                if kind == "step":
                    rs.last_progress, rs.last_step = now, rec["step"]
                    rs.first_step_seen = True
                    state.step_times.observe(rec)
                    state.stragglers.observe(rec, self.straggler_window)
                    if state.first_step_time is None:
                        state.first_step_time = now
                    self.metrics.write(json.dumps(rec) + "\n")
                    if rec.get("committed"):
                        g.last_step = max(g.last_step, rec["step"] + 1)
                        self._record_commit(g, rec)
                    if rec["rank"] == 0 and rec.get("loss") is not None:
                        if g.first_loss is None:
                            g.first_loss = rec["loss"]
                        g.last_loss = rec["loss"]
                    if rec["rank"] == 0 and rec.get("committed"):
                        state.last_commit[g.index] = rec
                    if self.judge is not None:
                        # Fingerprints and gradient votes; the verdicts are acted on once per tick.
                        self._verdicts += self.judge.observe(g.index, rec)
                    if g.status == GroupStatus.STARTING:
                        g.move(GroupStatus.RUNNING)
                        self.events.emit(EventKind.GROUP_STEPPING, group=g.index, attempt=g.attempt, step=rec["step"])
                    self._track_membership(rec)
                elif kind == "heartbeat":
                    rs.last_progress = now
                elif kind == "liveness":
                    rs.last_progress = now
                    if (rec.get("phase"), rec.get("phase_since")) != (rs.phase, rs.phase_since):
                        rs.phase, rs.phase_since = rec.get("phase"), rec.get("phase_since")
                        rs.phase_seen = min(now, rec.get("phase_since") or now)
                elif kind == "event":
                    rs.last_progress = now
                    name = rec.pop("event")
                    if name == "train_done":
                        rs.train_done = True
                    if name == "rank_finished":
                        rs.state_hash = rec.get("state_hash")
                        # A group healed while the others held the job open trained no step
                        # of its own at the end, yet holds the weights of every step.
                        g.last_step = max(g.last_step, rec.get("steps_trained", -1))
                    if name == "model_ready":
                        rs.model_ready = True
                        rs.link_probe = rec.get("link_probe")
                        state.transport_owner[rec.get("transport_metadata")] = (rec["group"], rec["rank"])
                        names = rec.pop("fingerprint_names", None)  # long: kept out of events.jsonl
                        if self.judge is not None:
                            self.judge.tensor_names(rec["rank"], names)
                    if name in ("weights_recovered", "recovery_started", "recovery_failed"):
                        # Name the peer by group: the Manager only knows its address.
                        rec["src_group"], rec["src_rank"] = state.transport_owner.get(rec.get("src"), (None, None))
                    if name == EventKind.CHECKPOINT_LOAD_FAILED and g.load_failure is None:
                        g.load_failure = dict(rec)
                    rec.pop("type", None)
                    if name == EventKind.RANK_ERROR:
                        rs.error = dict(rec)
                    state.ckpt_health.observe(self.events.emit(name, **rec))
        if g.ranks and all(r.train_done for r in g.ranks) and not g.train_done:
            g.train_done = True
            if g.status == GroupStatus.STARTING:
                g.move(GroupStatus.RUNNING)

    def _record_commit(self, g: GroupState, rec: dict) -> None:
        """Advance the job's committed step; a commit that went back (controller.ledger.CommitLedger)
        is a regression, named loudly. Ranks refuse such commits (rank.components.ft.CommitFloor):
        this is the second line."""
        state = self.state
        step = rec["step"]
        behind = state.ledger.record(step, rec.get("quorum_id") or 0)
        if behind is not None:
            regression = {"group": g.index, "rank": rec["rank"], "attempt": rec["attempt"], "step": step, "job_committed": behind}
            state.regressions.append(regression)
            self.events.emit(EventKind.STEP_REGRESSION, **regression)
        if rec.get("state_hash"):
            state.step_hashes.setdefault(step, {})[(g.index, rec["rank"])] = rec["state_hash"]
            quorum = rec.get("quorum_id") or 0
            other = redone_commit(state.commit_hashes.setdefault((step, rec["rank"]), {}), quorum, g.index, rec["state_hash"])
            this = {"quorum_id": quorum, "group": g.index}
            earlier, later = sorted((this, other), key=lambda c: c["quorum_id"]) if other is not None else (None, None)
            if later is not None and (step, later["quorum_id"]) not in state.redone_seen:
                state.redone_seen.add((step, later["quorum_id"]))
                redo = {"step": step, "group": later["group"], "quorum_id": later["quorum_id"], "earlier": earlier}
                state.steps_redone.append(redo)
                self.events.emit(EventKind.STEP_REDONE, **redo)
            for old in [s for s in state.step_hashes if s < step - HASHES_KEPT]:
                del state.step_hashes[old]
            for key in [k for k in state.commit_hashes if k[0] < step - HASHES_KEPT]:
                del state.commit_hashes[key]

    def _track_membership(self, rec: dict) -> None:
        members = tuple(rec.get("participating_groups") or ())
        if rec["rank"] != 0 or not rec.get("committed") or members == self.state.membership:
            return
        self.state.membership = members
        self.events.emit(
            EventKind.QUORUM_CHANGE,
            participating_groups=list(members),
            quorum_size=rec.get("quorum_size"),
            quorum_id=rec.get("quorum_id"),
            step=rec["step"],
            seen_by=rec["group"],
        )

    def consistent_at(self, groups: set[int], min_step: int) -> Optional[tuple[int, bool]]:
        """(step, equal) for the first step >= ``min_step`` that every rank of ``groups``
        hashed: whether every rank index holds the same state in each of them; None if no
        such step was reported yet."""
        ranks = range(self.ranks_per_group)
        hashes = self.state.step_hashes
        for step in sorted(s for s in hashes if s >= min_step):
            seen = hashes[step]
            if all((grp, r) in seen for grp in groups for r in ranks):
                return step, all(len({seen[(grp, r)] for grp in groups}) == 1 for r in ranks)
        return None
