"""The one recovery decision: what the controller does about a failure, and how a relaunch starts.

The watch loop (:mod:`monarch_ft.controller.loop`) sees a failure (a rank exited, a group hung,
a rank lost while no controller watched, a checkpoint that failed to load, a job-wide stall
that did not clear), describes it as a typed :class:`Failure`, asks the
:class:`RecoveryPlanner`, and applies the :class:`RecoveryAction` it returns, whose ``reason``
says why. The planner is pure: it reads the job's state
(:class:`~monarch_ft.controller.state.JobState`) and the facts the loop hands it (the ready
standbys, the fork server on the group's host, the newest intact checkpoint when the decision
needs it), and changes nothing. The rules it applies are typed policy objects
(:class:`RecoveryPolicy`, :class:`RestartBudget`), built from the config in one place.

A failure's decision, in order (each rule applies whatever the later ones would say):

1. a job-wide stall that did not clear: :class:`FullRestart` (``job_stall``); replicas whose
   state fingerprints disagree with no majority (controller.integrity.Diverged: none can be
   trusted): :class:`FullRestart` (``replicas_diverged``) from a checkpoint no newer than the
   step they last agreed on;
2. the group's last two launches failed the same way at start-up: :class:`GiveUp` (a crash
   loop: no relaunch, standby or full restart can get past it);
3. ``ft.recovery=full_restart``: :class:`FullRestart`;
4. no live peer holds the job's state and no intact checkpoint is left: :class:`StateLost`;
5. the restart budget (``ft.max_restarts`` within ``ft.restart_window_s``) is spent:
   :class:`GiveUp` (a failure that is not the group's fault, a checkpoint that failed to load,
   is not charged);
6. a standby is ready: :class:`Promote` it;
7. no live peer: :class:`DiskRollback` (a relaunch that loads the newest intact checkpoint);
8. else :class:`Relaunch` after a backoff.

Whatever the action, a failure that implicates its node (``Failure.suspects``: every rank on it
lost at once, or the scheduler counts it gone) adds that node to the ones every allocation is
kept off from then on (the action's ``exclude``: controller.placement.NodePool.with_suspects).

A slow group is a decision of its own (:meth:`RecoveryPlanner.on_straggler`): under
``ft.straggler=evict`` a straggler, of CPU or link, is :class:`Evict`-ed (failed with ``FailureKind.STRAGGLER``,
which the rules above then answer with rule 6, the ready standby; its node, where the launcher has
nodes, is a suspect excluded as for a node fault) only when a standby is ready,
its restart budget allows a relaunch, and the time it costs over the steps left exceeds one
recovery; otherwise :class:`KeepStraggler` says why.

A relaunch's start is a second decision, at launch (:meth:`RecoveryPlanner.launch`):
:class:`WarmFork` from the host's fork server, or :class:`ColdStart` with why not warm; a
warm fork that fails at launch is a third, recorded one (:meth:`RecoveryPlanner.fork_failed`:
a cold start, ``cold_because`` the fork's error).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional, Sequence

from monarch_ft.controller.budget import crash_loop, recent_restarts, restart_backoff
from monarch_ft.controller.fork_pool import ServerState, first_launch_path, relaunch_path
from monarch_ft.controller.standby_pool import recovery_path
from monarch_ft.controller.state import Failure, FailureKind, GroupState, JobState
from monarch_ft.controller.stragglers import Straggler, eviction_pays, loss_rate
from monarch_ft.records.decisions import JobStateLost, StateDecision, decide_state_source, needs_disk
from monarch_ft.records.events import GiveUpReason, RecoveryPath, StrEnum
from monarch_ft.records.integrity import INTEGRITY_ROLLBACK

__all__ = ["Failure", "FailureKind"]  # defined with the group state they are part of (controller.state)


# ---------------------------------------------------------------- policy
@dataclass(frozen=True)
class RestartBudget:
    """How often a group is relaunched: at most ``max_restarts`` within any ``window_s`` seconds
    (a rate, not a lifetime count: controller.budget.recent_restarts), each after a backoff
    doubling from ``backoff_s`` up to ``backoff_max_s``."""

    max_restarts: int
    window_s: float
    backoff_s: float
    backoff_max_s: float

    def recent(self, restart_times: Sequence[float], now: float) -> int:
        return recent_restarts(restart_times, now, self.window_s)

    def backoff(self, restart_times: Sequence[float], now: float) -> Optional[float]:
        """Seconds before the next relaunch; None: the budget is spent."""
        return restart_backoff(self.recent(restart_times, now), self.max_restarts, self.backoff_s, self.backoff_max_s)

    def charge(self, restart_times: Sequence[float], now: float) -> list[float]:
        """The relaunch times after one more at ``now`` (only the window's are kept:
        controller.json stays small over a long job)."""
        return [t for t in restart_times if now - t < self.window_s] + [now]


@dataclass(frozen=True)
class RecoveryPolicy:
    """The recovery knobs of ``ft``, as the planner applies them.

    Args:
        mode: ``ft.recovery``: ``live`` (only the failed group restarts, it heals from a peer)
            or ``full_restart`` (every group back to one disk checkpoint).
        budget: the restart budget.
        warm_fork: ``ft.warm_fork``.
        checkpoints: ``checkpoint.enable`` (without it, a job with no live peer has lost its state).
    """

    mode: str
    budget: RestartBudget
    warm_fork: bool = True
    checkpoints: bool = False

    FULL_RESTART: ClassVar[str] = "full_restart"

    @classmethod
    def from_config(cls, cfg) -> "RecoveryPolicy":
        """From the job's config (``cfg``: a JobConfig, already checked by its sections)."""
        ft = cfg.ft
        return cls(
            mode=ft.recovery,
            budget=RestartBudget(ft.max_restarts, ft.restart_window_s, ft.restart_backoff_s, ft.restart_backoff_max_s),
            warm_fork=ft.warm_fork,
            checkpoints=cfg.checkpoint.enable,
        )

    @property
    def full_restart(self) -> bool:
        return self.mode == self.FULL_RESTART


@dataclass(frozen=True)
class DiskFact:
    """The newest intact checkpoint step the job may go back to (None: none is left), and the
    steps found damaged on the way (``step N (why)``, named when none is left). Finding it
    reads every byte of a checkpoint, so the loop finds it only when
    :meth:`RecoveryPlanner.needs_disk` says the decision needs it."""

    step: Optional[int]
    tried: tuple[str, ...] = ()


@dataclass(frozen=True)
class ForkFact:
    """What the planner knows of warm forks for a group's relaunch: why the launcher cannot
    fork (None: it can) and the fork server on the group's host (None: there is none)."""

    problem: Optional[str] = None
    server: Optional[ServerState] = None
    exhausted: bool = False  # the host's server died before it was ready too often: none is started


# ---------------------------------------------------------------- actions
class ActionKind(StrEnum):
    """The kinds of :class:`RecoveryAction` (``restart_scheduled`` names its ``action``)."""

    PROMOTE = "promote"
    RELAUNCH = "relaunch"
    DISK_ROLLBACK = "disk_rollback"
    FULL_RESTART = "full_restart"
    GIVE_UP = "give_up"
    STATE_LOST = "state_lost"
    WARM_FORK = "warm_fork"
    COLD_START = "cold_start"
    EVICT = "evict"
    KEEP_STRAGGLER = "keep_straggler"


@dataclass(frozen=True)
class RecoveryAction:
    """What the loop does; ``reason`` says why, in words; ``exclude``: the nodes every allocation
    from now on is kept off (the failure's suspects added to those already out; None: unchanged),
    so a relaunch, or the standby built after a promotion, never lands on a node that just failed."""

    reason: str
    exclude: Optional[tuple[str, ...]] = None
    kind: ClassVar[ActionKind]
    # The RecoveryPath a relaunch of this kind comes up by (None: not a relaunch start).
    path: ClassVar[Optional[RecoveryPath]] = None


@dataclass(frozen=True)
class Promote(RecoveryAction):
    """A ready standby takes the failed group's place now (its state: a live peer, or the disk)."""

    kind: ClassVar[ActionKind] = ActionKind.PROMOTE

    group: int = -1
    standby: int = -1
    charged: bool = True
    path: ClassVar[Optional[RecoveryPath]] = RecoveryPath.STANDBY


@dataclass(frozen=True)
class Relaunch(RecoveryAction):
    """The group is relaunched after ``backoff_s`` (how it starts is decided at launch); its
    state comes from a live peer (decided at its launch gate)."""

    kind: ClassVar[ActionKind] = ActionKind.RELAUNCH

    group: int = -1
    backoff_s: float = 0.0
    charged: bool = True


@dataclass(frozen=True)
class DiskRollback(Relaunch):
    """A relaunch with no live peer left: the job's state is on disk only; the relaunch loads
    the newest intact checkpoint (``step`` now; decided again at its launch gate)."""

    kind: ClassVar[ActionKind] = ActionKind.DISK_ROLLBACK

    step: Optional[int] = None


@dataclass(frozen=True)
class FullRestart(RecoveryAction):
    """Every group stops and the job resumes from one disk checkpoint (``trigger``:
    ``full_restart``, the mode; ``job_stall``, the escalation of a stall; ``replicas_diverged``,
    an integrity rollback, to a checkpoint no newer than ``at_most``)."""

    kind: ClassVar[ActionKind] = ActionKind.FULL_RESTART

    failed_group: Optional[int] = None
    trigger: str = "full_restart"
    charged: bool = True
    at_most: Optional[int] = None


@dataclass(frozen=True)
class GiveUp(RecoveryAction):
    """The group is not relaunched again."""

    kind: ClassVar[ActionKind] = ActionKind.GIVE_UP

    group: int = -1
    why: GiveUpReason = GiveUpReason.RESTART_BUDGET


@dataclass(frozen=True)
class StateLost(RecoveryAction):
    """Every group holding the job's state is gone and no intact checkpoint is left: the job stops."""

    kind: ClassVar[ActionKind] = ActionKind.STATE_LOST


@dataclass(frozen=True)
class WarmFork(RecoveryAction):
    """The relaunch's ranks are forked from the fork server on the group's host."""

    kind: ClassVar[ActionKind] = ActionKind.WARM_FORK

    group: int = -1
    path: ClassVar[Optional[RecoveryPath]] = RecoveryPath.WARM_FORK


@dataclass(frozen=True)
class ColdStart(RecoveryAction):
    """The relaunch's ranks start as fresh interpreters; ``reason`` is why not warm
    (``cold_because``), ``planned`` the start that failed first (a warm fork), if any."""

    kind: ClassVar[ActionKind] = ActionKind.COLD_START

    group: int = -1
    planned: Optional[RecoveryPath] = None
    path: ClassVar[Optional[RecoveryPath]] = RecoveryPath.COLD_START


@dataclass(frozen=True)
class Evict(RecoveryAction):
    """A straggler is failed (``ft.straggler=evict``); the failure's own decision then promotes
    the ready standby (rule 6). ``loss_s`` the seconds it would cost over the steps left,
    ``cost_s`` one recovery's."""

    kind: ClassVar[ActionKind] = ActionKind.EVICT

    group: int = -1
    loss_s: float = 0.0
    cost_s: float = 0.0


class KeepReason(StrEnum):
    """Why a straggler is kept (the loop says so again only when this changes)."""

    POLICY = "policy"  # ft.straggler=report
    NO_STANDBY = "no_standby"
    BUDGET = "restart_budget"
    NOT_WORTH = "not_worth_it"
    NOT_YET = "not_slow_long_enough"  # a CPU straggler that has not yet cost one recovery


@dataclass(frozen=True)
class KeepStraggler(RecoveryAction):
    """A straggler stays (``ft.straggler=report``, or evicting it would not pay or could not
    promote a standby); ``reason`` says which."""

    kind: ClassVar[ActionKind] = ActionKind.KEEP_STRAGGLER

    group: int = -1
    why: KeepReason = KeepReason.POLICY


# ---------------------------------------------------------------- the planner
class RecoveryPlanner:
    """Decides, never acts (see the module docstring for the rules and their order).

    Args:
        policy: the recovery knobs.
    """

    def __init__(self, policy: RecoveryPolicy) -> None:
        self.policy = policy

    # ------------------------------------------------------------ a failure
    def needs_disk(self, job: JobState, failure: Failure) -> bool:
        """Whether :meth:`decide` needs the :class:`DiskFact` for ``failure``: a live relaunch
        with no live peer left once steps were committed (rules 4 and 7)."""
        if failure.kind in (FailureKind.STALL, FailureKind.DIVERGED) or self.policy.full_restart or self._crash_loop(job, failure):
            return False
        return needs_disk(job.live_peers(failure.group), job.job_step)

    def decide(self, job: JobState, failure: Failure, now: float, ready_standbys: Sequence[int] = (), disk: Optional[DiskFact] = None) -> RecoveryAction:
        """The action for ``failure`` at ``now``.

        Args:
            job: the job's state (read only).
            failure: what failed.
            now: the time of the decision (the restart budget's window ends there).
            ready_standbys: the ready standbys' numbers, the longest ready first.
            disk: the newest intact checkpoint, when :meth:`needs_disk` asked for it.
        """
        action = self._decide(job, failure, now, ready_standbys, disk)
        if failure.suspects:
            # Whatever comes next (a relaunch, a standby rebuilt, a full restart) keeps off them.
            return replace(action, exclude=job.nodes.with_suspects(failure.suspects))
        return action

    def _decide(self, job: JobState, failure: Failure, now: float, ready_standbys: Sequence[int], disk: Optional[DiskFact]) -> RecoveryAction:
        if failure.kind is FailureKind.STALL:
            return FullRestart("every stepping group stalled past ft.stall_timeout_s", trigger="job_stall")
        if failure.kind is FailureKind.DIVERGED:
            return FullRestart(
                f"the replicas' state disagrees with no majority: back to a checkpoint at or before step {failure.at_most}, the last they agreed on",
                trigger=INTEGRITY_ROLLBACK,
                at_most=failure.at_most,
            )
        g = job.groups[failure.group]
        if self._crash_loop(job, failure):
            return GiveUp("its last two launches failed the same way at start-up", group=g.index, why=GiveUpReason.CRASH_LOOP)
        if self.policy.full_restart:
            return FullRestart("ft.recovery=full_restart", failed_group=g.index, charged=failure.charged)
        from_disk = needs_disk(job.live_peers(g.index), job.job_step)
        if from_disk:
            if disk is None:
                raise ValueError("the decision needs the newest intact checkpoint: ask needs_disk() first")
            lost = self.state_lost(job, disk)
            if lost is not None:
                return lost
        backoff = self._backoff(g, failure.charged, now)
        if backoff is None:
            return GiveUp(self._budget_reason(g, now), group=g.index, why=GiveUpReason.RESTART_BUDGET)
        if recovery_path(self.policy.mode, bool(ready_standbys)) is RecoveryPath.STANDBY:
            return Promote(f"standby {ready_standbys[0]} is ready", group=g.index, standby=ready_standbys[0], charged=failure.charged)
        if from_disk:
            step = disk.step if disk else None
            return DiskRollback(
                f"no live group holds the job's state: it loads checkpoint step {step}", group=g.index, backoff_s=backoff, charged=failure.charged, step=step
            )
        return Relaunch("it heals from a live peer", group=g.index, backoff_s=backoff, charged=failure.charged)

    def reschedule(self, job: JobState, group: int, charged: bool, now: float) -> RecoveryAction:
        """One group's relaunch in a full restart: within its restart budget, or given up."""
        g = job.groups[group]
        backoff = self._backoff(g, charged, now)
        if backoff is None:
            return GiveUp(self._budget_reason(g, now), group=group, why=GiveUpReason.RESTART_BUDGET)
        return Relaunch("a full restart", group=group, backoff_s=backoff, charged=charged)

    def state_source(self, job: JobState, live_peers: Sequence[int], disk: Optional[DiskFact]) -> StateDecision | StateLost:
        """Where a (re)joining group's state comes from now (records.decisions.decide_state_source),
        or :class:`StateLost` when nothing holds it."""
        try:
            return decide_state_source(tuple(live_peers), job.job_step, disk.step if disk else None, tried=disk.tried if disk else ())
        except JobStateLost as e:
            return StateLost(str(e))

    def state_lost(self, job: JobState, disk: DiskFact) -> Optional[StateLost]:
        decision = self.state_source(job, (), disk)
        return decision if isinstance(decision, StateLost) else None

    # ------------------------------------------------------------ a slow group
    def on_straggler(
        self,
        job: JobState,
        straggler: Straggler,
        now: float,
        policy: str,
        ready_standbys: Sequence[int],
        recovery_s: float,
        steps_left: int,
        spent_s: Optional[float] = None,
    ) -> Evict | KeepStraggler:
        """What to do about a group found slower than its peers (controller.stragglers).

        ``evict`` only when every one of these holds (else the straggler is kept, and why):
        the policy is ``evict``; a standby is ready (without one, a relaunch on the same host
        would cost a cold start and come back as slow: the standby runs on another host, which
        cures a slow CPU and a slow link alike); the group's restart budget allows one
        more relaunch (an eviction must never give a group up); the time it costs,
        ``loss_rate x steps_left``, exceeds one recovery, ``recovery_s``
        (controller.stragglers.eviction_pays); and a CPU straggler has already cost the job one
        recovery since it was named (``spent_s``, controller.stragglers.cost_so_far): the rule
        of renting skis until the rent paid equals the price, which never pays more than twice
        the best choice made knowing how long the slowness lasts, where weighing only the steps
        left takes a burst of load a window long for the rest of the job.

        Args:
            job: the job's state.
            straggler: the verdict.
            now: the time of the decision.
            policy: ``ft.straggler`` (report or evict).
            ready_standbys: the ready standbys' numbers.
            recovery_s: one recovery's cost in seconds.
            steps_left: steps the job still has to train.
            spent_s: what a CPU straggler has cost the job since it was named (None: a link
                straggler, confirmed by two probe rounds instead).
        """
        g = job.groups[straggler.group]
        if policy != "evict":
            return KeepStraggler(f"ft.straggler={policy}", group=g.index)
        if not ready_standbys:
            return KeepStraggler("no standby is ready to take its place", group=g.index, why=KeepReason.NO_STANDBY)
        if self._backoff(g, True, now) is None:
            return KeepStraggler(self._budget_reason(g, now), group=g.index, why=KeepReason.BUDGET)
        loss = loss_rate(straggler) * max(0, steps_left)
        if not eviction_pays(straggler, recovery_s, steps_left):
            why = f"it costs {loss:.1f} s over the {steps_left} steps left, less than one recovery ({recovery_s:.1f} s)"
            return KeepStraggler(why, group=g.index, why=KeepReason.NOT_WORTH)
        if spent_s is not None and spent_s < recovery_s:
            why = f"it has cost {spent_s:.1f} s since it was named, less than one recovery ({recovery_s:.1f} s): kept until it has"
            return KeepStraggler(why, group=g.index, why=KeepReason.NOT_YET)
        return Evict(
            f"it costs {loss:.1f} s over the {steps_left} steps left, more than one recovery ({recovery_s:.1f} s)",
            group=g.index,
            loss_s=round(loss, 3),
            cost_s=round(recovery_s, 3),
        )

    # ------------------------------------------------------------ a relaunch's start
    def launch(self, job: JobState, group: int, fork: ForkFact) -> Optional[RecoveryAction]:
        """How group ``group``'s launch starts: None for its first launch (not a recovery),
        else :class:`WarmFork` or :class:`ColdStart` (controller.fork_pool.relaunch_path)."""
        if job.groups[group].attempt <= 0:
            return None
        path, why = relaunch_path(self.policy.mode, self.policy.warm_fork, fork.problem, fork.server)
        if path is RecoveryPath.WARM_FORK:
            return WarmFork("the fork server on its host is ready", group=group)
        return ColdStart(why or "cold", group=group)

    def first_launch(self, fork: ForkFact, waited_s: float) -> Optional[tuple[RecoveryPath, Optional[str]]]:
        """How a group's first launch starts (forked, or cold and why); None: it waits
        for its host's fork server, ``waited_s`` so far (controller.fork_pool.first_launch_path)."""
        return first_launch_path(self.policy.mode, self.policy.warm_fork, fork.problem, fork.server, fork.exhausted, waited_s)

    def fork_failed(self, action: WarmFork, error: str) -> ColdStart:
        """A warm fork that failed at launch: the ranks start cold, and the fork's error says why."""
        return ColdStart(error, group=action.group, planned=RecoveryPath.WARM_FORK)

    # ------------------------------------------------------------ rules
    def _crash_loop(self, job: JobState, failure: Failure) -> bool:
        return failure.group is not None and crash_loop(job.groups[failure.group].startup_failure, failure.startup)

    def _backoff(self, g: GroupState, charged: bool, now: float) -> Optional[float]:
        if not charged:
            return self.policy.budget.backoff_s
        return self.policy.budget.backoff(g.restart_times, now)

    def _budget_reason(self, g: GroupState, now: float) -> str:
        b = self.policy.budget
        return f"{b.recent(g.restart_times, now)} relaunches within ft.restart_window_s={b.window_s:g} (ft.max_restarts={b.max_restarts})"
