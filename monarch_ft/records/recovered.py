"""When a fault is recovered, and its MTTR: the one rule, for drills, their reports and ``status``.

A fault hits one group at one moment (a :class:`Failure`: the group, its attempt, and the step
and the groups it had just committed with). It is recovered at the group's first commit *back*:

- with every group it was with: a group stepping alone is not back;
- at or past the step it had: a group back at an older state (its initial weights) is not;
- from a later attempt, for a fault a restart answers: the killed processes' commits do not count;
- after the fault's marker event, for one that lasts or needs an actor (the link restored, a new
  controller attached, the Lighthouse back, the rank that acted on a collective fault): no
  commit before it counts;

and holding the weights the groups it is with hold (state hashes at the first step all of them
hashed; no hashes is unknown, which does not count against it). Its MTTR runs from the fault to
that commit, or to the marker for a fault under which the steps never stopped (a lost controller:
the job trained on, supervision was what was missing). A :class:`RecoveryRule` says which of
these apply to a kind of fault; each chaos fault kind declares its own (``chaos/kinds``), and
:data:`SEEN_FAILURES` holds those of the failures the controller records on its own.

Pure: records in, a verdict out. The chaos injector applies it live (the next fault waits for
it), ``chaos.mttr`` to the whole run (the drill report's ``back_in_quorum`` and MTTR), and
``python -m monarch_ft status`` to the faults it lists; so the three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from monarch_ft.records.events import EventKind, StrEnum
from monarch_ft.records.members import members_of


class Clock(StrEnum):
    """Where a fault's MTTR clock stops."""

    BACK_IN_QUORUM = "back_in_quorum"  # the group's first commit back (see the module's rule)
    MARKER = "marker"  # the marker event (once the group is back): the steps never stopped


class Scope(StrEnum):
    """Which marker events count."""

    GROUP = "group"  # the target group's own (a link restored, a rank's collective fault)
    JOB = "job"  # the job's (a new controller, the Lighthouse restarted)


@dataclass(frozen=True)
class RecoveryRule:
    """What recovered means for one kind of fault.

    Args:
        new_attempt: a restart answers it: only a later attempt's commits count.
        marker: the event after which commits count (None: any commit after the fault).
        scope: whose marker events count.
        clock: where the MTTR clock stops.
    """

    new_attempt: bool = False
    marker: Optional[EventKind] = None
    scope: Scope = Scope.GROUP
    clock: Clock = Clock.BACK_IN_QUORUM


# A group's processes were lost (killed, crashed, hung and killed, its host gone) and relaunched.
RESTARTED = RecoveryRule(new_attempt=True)
# Nothing to wait for but the group's own next commit in the quorum.
IN_PLACE = RecoveryRule()
# The controller was lost: recovered once a new one is attached (the clock stops there) and
# the group commits with the others after it.
CONTROLLER_REPLACED = RecoveryRule(marker=EventKind.CONTROLLER_ATTACHED, scope=Scope.JOB, clock=Clock.MARKER)
# The Lighthouse was lost: back once the groups commit together after its restart.
LIGHTHOUSE_BACK = RecoveryRule(marker=EventKind.LIGHTHOUSE_RESTARTED, scope=Scope.JOB)

# The failures the controller records by itself (``status`` lists them beside injected faults).
SEEN_FAILURES: dict[EventKind, RecoveryRule] = {
    EventKind.GROUP_FAILED: RESTARTED,
    EventKind.CONTROLLER_LOST: CONTROLLER_REPLACED,
    EventKind.LIGHTHOUSE_LOST: LIGHTHOUSE_BACK,
}


@dataclass(frozen=True)
class Failure:
    """One fault, as the rule needs it.

    Args:
        at: when it hit (injected, or seen by the controller).
        group: the group whose commits show the recovery (the target).
        attempt: that group's attempt when it hit.
        step: the step the group had committed then (it must come back at or past it).
        members: the groups it committed with then, itself included.
    """

    at: float
    group: int
    attempt: int
    step: int
    members: frozenset[int]

    @classmethod
    def after_commit(cls, at: float, group: int, attempt: int, commit: Optional[dict], groups: Iterable[int]) -> "Failure":
        """The failure of ``group`` at ``at``, whose newest commit before it was ``commit``.

        Args:
            at: when it hit.
            group: the target group.
            attempt: its attempt then.
            commit: its rank 0's newest committed step record before ``at`` (None: it had none).
            groups: every group of the job (the members when it had no commit).
        """
        if commit is None:
            return cls(at, group, attempt, -1, frozenset(groups) | {group})
        return cls(at, group, attempt, int(commit["step"]), frozenset(members_of(commit)) | {group})


@dataclass(frozen=True)
class Recovery:
    """The rule's verdict on one failure, from the records seen so far."""

    failure: Failure
    rule: RecoveryRule
    # When the marker came (the failure's time for a rule without one); None: not yet.
    marker_at: Optional[float]
    # The group's first commit back (a rank 0 step record); None: not back yet.
    back: Optional[dict]
    # Whether the groups held equal weights at the first step after ``back`` all hashed (None: unknown).
    weights_consistent: Optional[bool]

    @property
    def back_at(self) -> Optional[float]:
        return self.back["time"] if self.back is not None else None

    @property
    def recovered(self) -> bool:
        """Back, and not with other weights than its peers'."""
        return self.back is not None and self.weights_consistent is not False

    @property
    def mttr_s(self) -> Optional[float]:
        """Seconds from the failure to where its clock stops; None until it is back."""
        if self.back is None:
            return None
        stop = self.marker_at if self.rule.clock is Clock.MARKER and self.marker_at is not None else self.back["time"]
        return round(stop - self.failure.at, 3)

    def settled(self, hashes_expected: bool) -> bool:
        """Recovered for good, as a live judge must see it: back, and with the weights known
        equal where the ranks report hashes (a verdict in the making is not yet one).

        Args:
            hashes_expected: the ranks hash their state (``training.state_hash_every`` > 0).
        """
        return self.recovered and (self.weights_consistent is True or not hashes_expected)


def _time(record: dict) -> float:
    return float(record["time"])


def marker_time(failure: Failure, rule: RecoveryRule, events: Iterable[dict]) -> Optional[float]:
    """When the rule's marker came after the failure (the failure's time if it has none).

    Args:
        failure: the fault.
        rule: its kind's rule.
        events: event records (``events.jsonl``), any order.
    """
    if rule.marker is None:
        return failure.at
    seen = [
        e["time"] for e in events if e.get("event") == rule.marker and e["time"] >= failure.at and (rule.scope is Scope.JOB or e.get("group") == failure.group)
    ]
    return min(seen, default=None)


def is_back(failure: Failure, rule: RecoveryRule, commit: dict, since: float) -> bool:
    """Whether ``commit`` (a rank 0 committed step record) is the group back, ``since`` the marker."""
    return (
        commit.get("group") == failure.group
        and commit.get("rank", 0) == 0
        and bool(commit.get("committed"))
        and _time(commit) >= since
        and commit["step"] >= failure.step
        and (not rule.new_attempt or commit.get("attempt", 0) > failure.attempt)
        and failure.members <= set(members_of(commit))
    )


def weights_consistent(
    failure: Failure,
    back: dict,
    records: Iterable[dict],
    since: float,
    ranks: Optional[int] = None,
    until: float = float("inf"),
) -> Optional[bool]:
    """Equal weights across the groups at the first step at or past ``back``'s that they all hashed.

    Args:
        failure: the fault (its members are the groups compared).
        back: the group's commit back.
        records: step records of every rank (those with a ``state_hash`` count).
        since: only states trained after this (the last relaunch the fault caused: a full
            restart trains some step numbers twice, the first time on the stale state).
        ranks: ranks per group: a step counts once every rank of every group hashed it (a
            live judge must not decide on half of them); None: once every group did.
        until: the next fault; a record a little after it still holds a state committed before.
    """
    by_step: dict[int, dict[tuple[int, int], str]] = {}
    for m in sorted(records, key=_time):
        # The first hash per (group, rank) and step wins: a later attempt cannot overwrite it.
        if m.get("state_hash") and m["step"] >= back["step"] and since <= m["time"] < until + 2.0:
            by_step.setdefault(m["step"], {}).setdefault((m["group"], m["rank"]), m["state_hash"])
    for step in sorted(by_step):
        seen = by_step[step]
        complete = {g for g, _ in seen} >= failure.members
        if ranks is not None:
            complete = all(sum(1 for g2, _ in seen if g2 == g) >= ranks for g in failure.members)
        if complete:
            return all(len({h for (_, r), h in seen.items() if r == rank}) == 1 for rank in {r for _, r in seen})
    return None


def recovery(
    failure: Failure,
    rule: RecoveryRule,
    events: Iterable[dict],
    records: Iterable[dict],
    ranks: Optional[int] = None,
    until: float = float("inf"),
) -> Recovery:
    """The rule applied to what was recorded: when ``failure`` was back, and with which weights.

    Args:
        failure: the fault.
        rule: its kind's rule.
        events: event records (the marker's, ``group_launched``); any order.
        records: step records (rank 0's commits decide when the group is back; every rank's
            state hashes whether its weights are its peers'); any order.
        ranks: ranks per group (see :func:`weights_consistent`).
        until: the next fault's time: nothing at or after it belongs to this one.
    """
    events = [e for e in events if e["time"] < until]
    records = list(records)
    marker_at = marker_time(failure, rule, events)
    back = None
    if marker_at is not None:
        back = next((c for c in sorted(records, key=_time) if _time(c) < until and is_back(failure, rule, c, marker_at)), None)
    consistent = None
    if back is not None:
        launched = [e["time"] for e in events if e.get("event") == EventKind.GROUP_LAUNCHED and failure.at <= e["time"] <= back["time"]]
        consistent = weights_consistent(failure, back, records, max(launched, default=failure.at), ranks, until)
    return Recovery(failure, rule, marker_at, back, consistent)
