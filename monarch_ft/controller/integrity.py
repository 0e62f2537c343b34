"""Silent data corruption, the controller's side: the replicas compared, blame by vote.

Groups that committed the same step in one quorum hold the same bits, so their ranks'
fingerprints of that step (records.integrity, in the step records) must be equal, rank index
by rank index. :class:`IntegrityJudge` gathers them per *round* (a fingerprinted step, in one
quorum; the state after a vetoed step is a round of its own) and, once every group of the
round has reported, decides:

- all equal: :class:`Agreed`; each group's newest agreed step is the state it is known good at;
- a strict majority and a minority that differs: the minority is corrupt (:class:`Corrupt`),
  named with the tensors that differ; the controller fails it and it heals from the majority
  through the normal recovery path;
- no strict majority (two groups, or a tie): nobody can be trusted (:class:`Diverged`); the
  controller rolls the job back to the newest checkpoint at or before the step they last
  agreed on, and sets aside every newer one.

A group that votes against commits (its gradient check) ``ft.suspect_vetoes`` times in a row
while its state agrees is :class:`Suspect`: its compute, not its memory, is bad.

Also here, pure: the interval ``ft.integrity_every=auto`` picks (:func:`choose_interval`) and
whether a checkpoint holds the state the replicas agreed on at its step (:meth:`IntegrityJudge.vouch`).
What the judge knows is :class:`IntegrityState`, a part of the job's state (a takeover goes on
with it). The tick's decision (:mod:`monarch_ft.controller.decide.reports`) feeds it the step records; the
verdicts are applied by :mod:`monarch_ft.controller.decide.recovery`, through the planner: a corrupt or suspect
group fails like any group, a divergence is a full restart from no newer than ``trusted_step``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from monarch_ft.records.integrity import differing_tensors
from monarch_ft.records.members import members_of

# Rounds kept waiting for their last reports; an older incomplete one is dropped once a newer
# one completes (a group that died mid-round never reports it).
KEEP_ROUNDS = 64
# Agreed steps remembered, to vouch for the checkpoints written at them.
KEEP_AGREED = 512
# Fingerprinted steps ``auto`` times before it decides (after the first WARMUP steps).
AUTO_SAMPLES = 20
AUTO_WARMUP_STEPS = 5
AUTO_MAX_EVERY = 1024


def choose_interval(ratios: Sequence[float], budget: float) -> tuple[int, str]:
    """The smallest power of two N at which fingerprints cost at most ``budget`` of a step.

    Args:
        ratios: per fingerprinted step, the fingerprint's seconds over the step's own seconds.
        budget: ``ft.integrity_budget`` (0.01: 1%).

    Returns:
        (N, why): why names the measured cost and the cost at N.
    """
    cost = statistics.median(ratios)
    every = 1
    while cost / every > budget and every < AUTO_MAX_EVERY:
        every *= 2
    if every == 1:
        why = f"a fingerprint costs {cost:.2%} of a step (median of {len(ratios)}), within ft.integrity_budget={budget:g}: every step"
    else:
        why = f"a fingerprint costs {cost:.2%} of a step (median of {len(ratios)}), above ft.integrity_budget={budget:g}; every {every}: {cost / every:.2%}"
    return every, why


@dataclass(frozen=True, order=True)
class RoundKey:
    """A round: one fingerprinted state in one quorum (a frozen dataclass, not a tuple, so a
    snapshot of the judge's state restores it as a key)."""

    step: int  # the committed steps the state holds (records.integrity's ``step``)
    vetoed: bool  # taken after a vetoed step
    quorum: int  # the quorum the step ran in


@dataclass(frozen=True)
class Print:
    """One rank's fingerprint of one round."""

    group: int
    rank: int
    attempt: int
    digest: str
    tensors: str


@dataclass
class Round:
    key: RoundKey
    record_step: int  # the step record that carried it (a committed step's, or the vetoed one's)
    members: set[int] = field(default_factory=set)
    prints: dict[tuple[int, int], Print] = field(default_factory=dict)


@dataclass(frozen=True)
class Agreed:
    step: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Corrupt:
    """The minority of a round. ``blamed``: group -> its attempt; ``tensors``: group -> the
    tensors that differ from the majority's (rank by rank, merged); ``trusted``: group -> the
    newest step it agreed with its peers at (its checkpoints after it are suspect)."""

    step: int
    record_step: int
    vetoed: bool
    blamed: dict[int, int]
    majority: tuple[int, ...]
    ranks: dict[int, tuple[int, ...]]
    tensors: dict[int, tuple[str, ...]]
    trusted: dict[int, int]


@dataclass(frozen=True)
class Diverged:
    """No strict majority: ``groups`` disagree and none can be trusted; ``trusted_step`` is the
    newest step all of them agreed on, the newest state known good."""

    step: int
    record_step: int
    vetoed: bool
    groups: tuple[int, ...]
    attempts: dict[int, int]
    tensors: tuple[str, ...]
    trusted_step: int


@dataclass(frozen=True)
class Suspect:
    group: int
    attempt: int
    step: int
    vetoes: int


Verdict = Union[Agreed, Corrupt, Diverged, Suspect]


@dataclass
class IntegrityState:
    """What the judge knows, kept in the job's state (controller.state.JobState.integrity), so a
    controller that takes the job over goes on with the rounds, the steps agreed on (which vouch
    for checkpoints), the condemned attempts and the veto streaks of the one before it."""

    # Rounds waiting for their last reports.
    rounds: dict[RoundKey, Round] = field(default_factory=dict)
    # group -> the newest step it agreed with its peers at; step -> rank -> the digest agreed on.
    last_agreed: dict[int, int] = field(default_factory=dict)
    agreed: dict[int, dict[int, str]] = field(default_factory=dict)
    # rank -> tensor names, in fingerprint order (its model_ready event).
    names: dict[int, list[str]] = field(default_factory=dict)
    # (group, attempt) blamed: their reports no longer count.
    condemned: set[tuple[int, int]] = field(default_factory=set)
    # group -> its newest attempt reporting; (group, attempt) -> its vetoes in a row.
    attempts: dict[int, int] = field(default_factory=dict)
    streak: dict[tuple[int, int], int] = field(default_factory=dict)
    # The step the job started (or was rolled back) at: known good.
    start_step: int = 0
    # ft.integrity_every=auto: the fingerprint's cost per step timed so far, and whether it decided.
    ratios: list[float] = field(default_factory=list)
    decided: bool = False


class IntegrityJudge:
    """Gathers fingerprints into rounds and decides each; pure (records in, verdicts out).

    Args:
        ranks_per_group: a round is complete once every rank of every member group reported.
        auto: ``ft.integrity_every`` is auto (the judge times fingerprints, :meth:`interval`).
        budget: ``ft.integrity_budget``.
        suspect_vetoes: ``ft.suspect_vetoes``.
        manifests_comparable: the fingerprinted state is what a checkpoint holds (ft.mode=hsdp:
            model and optimizer), so checkpoints can be vouched for by the rounds.
        start_step: the step the job started (or resumed) at: known good (when ``state`` is new).
        state: what it knows (the job's, restored by a takeover); default: a new one.
    """

    def __init__(
        self,
        ranks_per_group: int,
        auto: bool = False,
        budget: float = 0.01,
        suspect_vetoes: int = 3,
        manifests_comparable: bool = True,
        start_step: int = 0,
        state: Optional[IntegrityState] = None,
    ) -> None:
        self.ranks = ranks_per_group
        self.auto, self.budget, self.suspect_vetoes = auto, budget, suspect_vetoes
        self.manifests_comparable = manifests_comparable
        self.state = state if state is not None else IntegrityState(start_step=start_step)
        # auto's decision, made in observe() and taken once by interval() in the same tick.
        self._interval: Optional[tuple[int, str, float]] = None
        # The groups whose reporting attempt is condemned (None: to be worked out again, after a
        # condemnation or a new attempt). Almost always empty: a round is then complete exactly
        # when every member's every rank reported, a count.
        self._silenced: Optional[set[int]] = None
        # Whether every open round must be looked at again (a new attempt, a condemnation, or a
        # state just restored); else only the round a record touched can have become complete.
        self._recheck_all = True
        self._last_key: Optional[RoundKey] = None

    # The state's parts, by their short names (the rules below read them).
    @property
    def rounds(self) -> dict[RoundKey, Round]:
        return self.state.rounds

    @property
    def agreed(self) -> dict[int, dict[int, str]]:
        return self.state.agreed

    @property
    def names(self) -> dict[int, list[str]]:
        return self.state.names

    @property
    def condemned(self) -> set[tuple[int, int]]:
        return self.state.condemned

    @property
    def attempts(self) -> dict[int, int]:
        return self.state.attempts

    @property
    def streak(self) -> dict[tuple[int, int], int]:
        return self.state.streak

    # ------------------------------------------------------------ input
    def tensor_names(self, rank: int, names: Optional[list[str]]) -> None:
        """The order of the tensors in rank index ``rank``'s fingerprints (its model_ready event)."""
        if names:
            self.names[rank] = list(names)

    def observe(self, group: int, record: dict[str, Any]) -> list[Verdict]:
        """One step record of a rank; the verdicts it completes (usually none)."""
        rank, attempt = int(record.get("rank", 0)), int(record.get("attempt", 0))
        if (group, attempt) in self.condemned:
            return []
        if attempt > self.attempts.get(group, -1):
            self.attempts[group] = attempt
            self._silenced, self._recheck_all = None, True
        out: list[Verdict] = []
        if self.auto:
            self._time(record)
        suspect = self._vote(group, rank, attempt, record)
        fp = record.get("fingerprint")
        if fp:
            key = self._round_key(int(fp["step"]), bool(fp.get("vetoed")), int(record.get("quorum_id") or 0))
            rnd = self.rounds.get(key)
            if rnd is None:
                # Its members are its quorum's: every record of a round names the same ones.
                rnd = self.rounds[key] = Round(key, int(record["step"]), set(members_of(record)))
            rnd.members.add(group)
            if (group, rank) not in rnd.prints:
                rnd.prints[(group, rank)] = Print(group, rank, attempt, str(fp["digest"]), str(fp.get("tensors") or ""))
            out += self._settle(key)
        if suspect is not None and (group, attempt) not in self.condemned:
            out.append(suspect)
        return out

    def _round_key(self, step: int, vetoed: bool, quorum: int) -> RoundKey:
        """The round's key, the one made for the record before when it names the same round:
        every group's record of a step does, and a frozen dataclass made and hashed per record
        was a tenth of the judge's time at 1,024 groups."""
        last = self._last_key
        if last is not None and last.step == step and last.vetoed == vetoed and last.quorum == quorum:
            return last
        key = self._last_key = RoundKey(step, vetoed, quorum)
        return key

    def _vote(self, group: int, rank: int, attempt: int, record: dict[str, Any]) -> Optional[Suspect]:
        """Count a group's vetoes in a row on its rank 0's records; a commit ends the streak."""
        if rank != 0:
            return None
        key = (group, attempt)
        if group in (record.get("vetoed_by") or ()):
            self.streak[key] = self.streak.get(key, 0) + 1
            if self.streak[key] == self.suspect_vetoes:
                return Suspect(group, attempt, int(record["step"]), self.streak[key])
        elif record.get("committed"):
            self.streak[key] = 0
        return None

    def _time(self, record: dict[str, Any]) -> None:
        """auto's measure of one record's fingerprint cost (called with auto on)."""
        st = self.state
        if st.decided or not record.get("fingerprint") or record.get("fingerprint_s") is None:
            return
        step_s = record.get("step_time_s") or 0.0
        if record["step"] >= AUTO_WARMUP_STEPS and step_s > 0:
            st.ratios.append(float(record["fingerprint_s"]) / step_s)
        if len(st.ratios) >= AUTO_SAMPLES:
            every, why = choose_interval(st.ratios, self.budget)
            self._interval = (every, why, statistics.median(st.ratios))
            st.decided = True

    def interval(self) -> Optional[tuple[int, str, float]]:
        """auto's decision, once, when it is made: (every, why, median cost per step); then None."""
        decided, self._interval = self._interval, None
        return decided

    # ------------------------------------------------------------ deciding
    def _expected(self, rnd: Round) -> set[int]:
        """The round's groups, less those whose reporting attempt was condemned (failed, and
        their replacement not reporting yet)."""
        return {g for g in rnd.members if (g, self.attempts.get(g, 0)) not in self.condemned}

    def _complete(self, rnd: Round) -> bool:
        """Every rank of every expected group reported. A count first (a print per rank of every
        expected member; a check per record of every member would cost groups x groups a step):
        the full check only once the count is reached. The expected members are the members less
        the silenced groups (a handful), so a condemned attempt keeps the count cheap too (it
        once turned every record into a full check: a second of CPU a step at 1,024 groups)."""
        silenced = self._silenced_groups()
        expected_count = len(rnd.members) - len(silenced & rnd.members) if silenced else len(rnd.members)
        if len(rnd.prints) < self.ranks * expected_count:
            return False
        expected = self._expected(rnd)
        return bool(expected) and all((g, r) in rnd.prints for g in expected for r in range(self.ranks))

    def _silenced_groups(self) -> set[int]:
        if self._silenced is None:
            self._silenced = {g for g, a in self.condemned if self.attempts.get(g, 0) == a}
        return self._silenced

    def _settle(self, touched: RoundKey) -> list[Verdict]:
        """Decide the rounds that are complete, oldest first.

        Why only ``touched`` as a rule: a round's completeness changes with its own prints and
        members (a record of it) or with the attempts and condemnations (``_recheck_all``); a
        look at every open round per record cost groups x rounds a record (5.6 million checks
        in 100 steps of 1,024 groups). ``touched``: the round the record just added to."""
        if self._recheck_all:
            self._recheck_all = False
            keys = sorted(self.rounds)
        else:
            rnd = self.rounds.get(touched)
            if (rnd is None or not self._complete(rnd)) and len(self.rounds) <= KEEP_ROUNDS:
                return []  # most records: the round is still open, nothing to drop
            keys = [touched]
        out: list[Verdict] = []
        for key in keys:
            rnd = self.rounds.get(key)
            if rnd is None or not self._complete(rnd):
                continue
            del self.rounds[key]
            # Older rounds still waiting will not complete (their reporter is gone): dropped.
            for old in [k for k in self.rounds if k.step < key.step]:
                del self.rounds[old]
            verdict = self._decide(rnd)
            if verdict is not None:
                out.append(verdict)
        if len(self.rounds) > KEEP_ROUNDS:
            for old in sorted(self.rounds)[:-KEEP_ROUNDS]:
                del self.rounds[old]
        return out

    def _trusted(self, group: int) -> int:
        return self.state.last_agreed.get(group, self.state.start_step)

    def _decide(self, rnd: Round) -> Optional[Verdict]:
        expected = self._expected(rnd)
        groups = sorted({g for g, _ in rnd.prints if g in expected})
        if len(groups) < 2:
            return None
        minority: dict[int, set[int]] = {}  # group -> its disagreeing ranks
        majority: set[int] = set(groups)
        undecided = False
        example: dict[int, int] = {}  # rank -> a majority group (for the tensor names)
        for r in range(self.ranks):
            by_group = {g: rnd.prints[(g, r)].digest for g in groups}
            counts = Counter(by_group.values())
            if len(counts) == 1:
                continue
            top, n = counts.most_common(1)[0]
            if 2 * n <= len(by_group):
                undecided = True
                continue
            for g, d in by_group.items():
                if d != top:
                    minority.setdefault(g, set()).add(r)
            majority &= {g for g, d in by_group.items() if d == top}
            example[r] = min(g for g, d in by_group.items() if d == top)
        step = rnd.key.step
        if undecided:
            a, b = groups[0], groups[1]
            tensors = sorted({t for r in range(self.ranks) for t in self._differ(rnd, a, b, r)})
            attempts = {g: rnd.prints[(g, 0)].attempt for g in groups}
            verdict = Diverged(step, rnd.record_step, rnd.key.vetoed, tuple(groups), attempts, tuple(tensors), min(self._trusted(g) for g in groups))
            # At once, not when the rollback is applied: the next round of the same attempts
            # (reported in the same tick, before the controller acts) would roll back twice.
            self.condemn(attempts)
            return verdict
        if minority:
            blamed = {g: rnd.prints[(g, 0)].attempt for g in minority}
            verdict = Corrupt(
                step,
                rnd.record_step,
                rnd.key.vetoed,
                blamed,
                tuple(sorted(majority)),
                {g: tuple(sorted(rs)) for g, rs in minority.items()},
                {g: tuple(sorted({t for r in rs for t in self._differ(rnd, g, example[r], r)})) for g, rs in minority.items()},
                {g: self._trusted(g) for g in minority},
            )
            self._agree(step, sorted(majority), rnd)
            self.condemn(blamed)
            return verdict
        self._agree(step, groups, rnd)
        return Agreed(step, tuple(groups))

    def _differ(self, rnd: Round, a: int, b: int, rank: int) -> list[str]:
        return differing_tensors(rnd.prints[(a, rank)].tensors, rnd.prints[(b, rank)].tensors, self.names.get(rank))

    def _agree(self, step: int, groups: list[int], rnd: Round) -> None:
        for g in groups:
            self.state.last_agreed[g] = max(self.state.last_agreed.get(g, self.state.start_step), step)
        self.agreed[step] = {r: rnd.prints[(groups[0], r)].digest for r in range(self.ranks)}
        for old in sorted(self.agreed)[:-KEEP_AGREED]:
            del self.agreed[old]

    def condemn(self, blamed: dict[int, int]) -> None:
        """Stop counting reports of these (group, attempt)s: failed, their replacement reports anew."""
        self._silenced, self._recheck_all = None, True
        for g, a in blamed.items():
            self.condemned.add((g, a))
            self.state.last_agreed.pop(g, None)
            for rnd in self.rounds.values():
                for key in [k for k, p in rnd.prints.items() if p.group == g and p.attempt == a]:
                    del rnd.prints[key]

    def rolled_back(self, step: int, attempts: dict[int, int]) -> None:
        """The job went back to ``step`` (every group relaunched): what was reported since is moot."""
        self.condemn(attempts)
        self.rounds.clear()
        self.streak.clear()
        self.state.start_step = step
        self.state.last_agreed.clear()
        for old in [s for s in self.agreed if s > step]:
            del self.agreed[old]

    # ------------------------------------------------------------ checkpoints
    def vouch(self, step: int, manifest: dict[int, str]) -> Optional[str]:
        """What is wrong with a checkpoint of ``step`` whose manifest carries ``manifest``
        (rank -> digest) against the state the replicas agreed on at that step; None when it
        matches, or when either is unknown (no round at that step, an older manifest)."""
        agreed = self.agreed.get(step)
        if not self.manifests_comparable or not agreed or not manifest:
            return None
        wrong = sorted(r for r, d in manifest.items() if r in agreed and agreed[r] != d)
        if not wrong:
            return None
        return f"rank {wrong[0]}'s state (fingerprint {manifest[wrong[0]]}) is not what the replicas agreed on at step {step} ({agreed[wrong[0]]})"
