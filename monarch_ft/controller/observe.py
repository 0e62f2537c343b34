"""The first stage of a tick: one read of the world, in one fixed order, into one typed value.

Every race this controller's history found was a question of read order: a group's last steps
written after the tick's read of its reports but before its exit was seen (so it was marked
done with its last records unread); two groups' exits read one at a time (so the first one's
recovery counted the second, dead, as a live peer); a finish read on either side of a commit.
So the tick reads the world once, here, and nothing after this stage polls a process or reads a
rank's file in that tick: :mod:`monarch_ft.controller.decide` decides on :class:`Observations`
alone, and :mod:`monarch_ft.controller.act` acts.

The order, and why:

1. **exits**: every process's poll (each active group's ranks, each standby's, each fork server);
2. **process samples**: the OS state and CPU seconds of every rank still running (the hang model;
   past :data:`SAMPLED_GROUPS_PER_TICK` groups, of a share of them in turn);
3. **reports**: every rank's report file read to its end (groups, then standbys). After the
   exits: a rank writes its last records (its last steps, ``rank_finished``, ``rank_error``)
   *before* it exits, so a rank seen exited here has all its records read in the same tick;
4. **control files**: a ``stop`` request, the hold, the current start gate;
5. **the Lighthouse**: alive or not;
6. **nodes**: new placements, the scheduler's view of its nodes, the allocations it holds
   pending (launchers with nodes);
7. what the controller's own helper threads finished: a link probe round, a checkpoint scrub
   pass, the hosts a fault's timer returned; and the signals it was sent (stop, detach).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from monarch_ft.common.process import process_sample
from monarch_ft.controller.fork_pool import ServerState
from monarch_ft.controller.link_probe import ProbeRound
from monarch_ft.launcher.base import Capability
from monarch_ft.records.report_records import ReportRecord, StepRecord

if TYPE_CHECKING:
    from monarch_ft.controller.checkpoints import CheckpointScrub
    from monarch_ft.controller.fork_pool import WarmForks
    from monarch_ft.controller.lighthouse import Lighthouse
    from monarch_ft.controller.link_probe import LinkProber
    from monarch_ft.controller.state import JobState
    from monarch_ft.controller.takeover import Takeover
    from monarch_ft.launcher.base import Launcher
    from monarch_ft.records.layout import RunLayout

# A rank or a standby rank: (group or standby number, rank).
RankKey = tuple[int, int]
# The most groups whose ranks' OS state and CPU time are sampled in one tick (each a psutil read
# per rank). Up to this many groups, every group every tick; past it, a share of the groups in
# turn, every group every ceil(groups / this) ticks: the hang model then judges each group as
# often, with its samples that fresh (monarch_ft.controller.decide.failures.judge_group).
SAMPLED_GROUPS_PER_TICK = 64


def sampled_share(active: list[int], turn: int, budget: int = SAMPLED_GROUPS_PER_TICK) -> Optional[set[int]]:
    """The groups of ``active`` sampled at tick ``turn``: None for every one (at most ``budget``),
    else those whose place in ``active`` is ``turn`` modulo ceil(len(active) / budget)."""
    if len(active) <= budget:
        return None
    period = -(-len(active) // budget)
    return {g for i, g in enumerate(active) if i % period == turn % period}


@dataclass(frozen=True)
class ProcessSample:
    """A running rank's OS state (psutil's: running, sleeping, stopped, zombie, ...) and its CPU
    seconds (every thread's), read at once; both None where the launcher runs it elsewhere."""

    os_state: Optional[str]
    cpu_s: Optional[float]


@dataclass(frozen=True)
class ForkServerSeen:
    """One fork server as seen this tick."""

    host: str
    pid: int
    state: ServerState
    alive: bool
    exit_code: Optional[int]
    ready_info: dict[str, Any]
    log_path: str


@dataclass(frozen=True)
class ControlFiles:
    """The run directory's control files the tick reads: a ``stop`` command's request, the hold
    (finished groups keep serving quorums), whether the current shared start gate is open."""

    stop_request: bool = False
    hold: bool = False
    start_gate_open: bool = False


@dataclass
class Observations:
    """Everything a tick saw, in the order it was read (see the module docstring).

    Every field is plain data: a fast test builds one by hand (the race replays of
    ``tests/unit/test_tick_races.py``) and gives it to :func:`monarch_ft.controller.decide.decide`.
    """

    now: float
    # Ranks that exited since the last tick: (group, rank) -> exit code (negative: a signal).
    exits: dict[RankKey, int] = field(default_factory=dict)
    # Each sampled running rank's OS state and CPU seconds, and which groups were sampled (None:
    # every one; see SAMPLED_GROUPS_PER_TICK).
    samples: dict[RankKey, ProcessSample] = field(default_factory=dict)
    sampled: Optional[set[int]] = None
    # Each active group's new report records: group -> [(rank, record)], rank by rank, in file order.
    reports: dict[int, list[tuple[int, ReportRecord]]] = field(default_factory=dict)
    # The same for the standbys (by standby number), and the OS state of each ready standby's ranks.
    standby_exits: dict[RankKey, int] = field(default_factory=dict)
    standby_reports: dict[int, list[tuple[int, ReportRecord]]] = field(default_factory=dict)
    standby_os: dict[RankKey, Optional[str]] = field(default_factory=dict)
    # Fork servers by host key, and each unfinished group's host key (warm forks on).
    forks: dict[str, ForkServerSeen] = field(default_factory=dict)
    fork_hosts: dict[int, str] = field(default_factory=dict)
    control: ControlFiles = field(default_factory=ControlFiles)
    # A signal that asked the controller to stop (its name), or to detach.
    stop_signal: Optional[str] = None
    detach_requested: bool = False
    lighthouse_alive: bool = True
    lighthouse_exit: Optional[int] = None
    # New placements of allocations, the scheduler's view of its nodes, and the allocations it
    # holds pending with the nodes each keeps off (launchers with nodes).
    placements: list[dict] = field(default_factory=list)
    node_states: dict[str, str] = field(default_factory=dict)
    pending: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # A probe round and checkpoint scrub passes the helper threads finished; a round still running.
    probe: Optional[ProbeRound] = None
    probe_busy: bool = False
    scrub: list[dict] = field(default_factory=list)
    # Hosts whose slowness ended (a fault's timer told the job control), to be placed on again.
    returned_hosts: list[str] = field(default_factory=list)
    # Each running group's host (launchers with hosts of their own: a straggler's is left out).
    group_hosts: dict[int, str] = field(default_factory=dict)

    def exited(self, group: int) -> dict[int, int]:
        """``group``'s ranks that exited this tick: rank -> code."""
        return {r: code for (g, r), code in self.exits.items() if g == group}

    def read_steps(self) -> bool:
        """Whether the groups' reports held a step record. A tick that read none is quiet: work
        that may wait (a save of records taken in, the straggler judgement) is done there. Not
        merely no record: ranks write heartbeats and liveness between their steps."""
        return any(isinstance(rec, StepRecord) for records in self.reports.values() for _, rec in records)


class Observer:
    """Reads the world once per tick (:meth:`observe`).

    Args:
        state: the job's state (which groups and ranks to read; read only).
        layout: the run directory's paths.
        launcher: the job's launcher (nodes, placements, hosts).
        forks: the warm fork servers.
        lighthouse: the job's Lighthouse.
        prober: the link prober (its finished round).
        scrub: the checkpoint scrub (its finished passes).
        takeover: the takeover (a detach request).
    """

    def __init__(
        self,
        state: "JobState",
        layout: "RunLayout",
        launcher: "Launcher",
        forks: "WarmForks",
        lighthouse: "Lighthouse",
        prober: "LinkProber",
        scrub: "CheckpointScrub",
        takeover: "Takeover",
        returned_hosts: Optional[Callable[[], list[str]]] = None,
    ) -> None:
        self.state = state
        self.layout = layout
        self.launcher = launcher
        self.forks = forks
        self.lighthouse = lighthouse
        self.prober = prober
        self.scrub = scrub
        self.takeover = takeover
        self.returned_hosts = returned_hosts or list
        self._turn = 0

    def observe(self, now: float) -> Observations:
        """One read of the world at ``now``, in the documented order."""
        state = self.state
        obs = Observations(now=now)
        active = [g for g in state.groups if g.active]
        # 1. exits: every process's poll.
        for g in active:
            for rs in g.ranks:
                if rs.exited is None:
                    code = rs.proc.poll()
                    if code is not None:
                        obs.exits[(g.index, rs.rank)] = code
        for sb in state.standby.standbys:
            for rs in sb.ranks:
                if rs.exited is None:
                    code = rs.proc.poll()
                    if code is not None:
                        obs.standby_exits[(sb.number, rs.rank)] = code
        for key, server in self.forks.servers.items():
            code = server.proc.poll()
            server_state = server.state
            obs.forks[key] = ForkServerSeen(
                key, server.pid, server_state, server_state is not ServerState.GONE and code is None, code, dict(server.ready_info), server.log_path
            )
        # 2. process samples of the ranks still running (of a share of the groups, past SAMPLED_GROUPS_PER_TICK).
        self._turn += 1
        obs.sampled = sampled_share([g.index for g in active], self._turn)
        for g in active:
            if obs.sampled is not None and g.index not in obs.sampled:
                continue
            for rs in g.ranks:
                if rs.exited is None and (g.index, rs.rank) not in obs.exits:
                    obs.samples[(g.index, rs.rank)] = ProcessSample(*process_sample(rs.proc.pid))
        for sb in state.standby.ready():
            for rs in sb.ranks:
                if rs.exited is None and (sb.number, rs.rank) not in obs.standby_exits:
                    obs.standby_os[(sb.number, rs.rank)] = process_sample(rs.proc.pid)[0]
        # 3. reports, each read to its end.
        for g in active:
            obs.reports[g.index] = [(rs.rank, rec) for rs in g.ranks for rec in rs.tail.read_records()]
        for sb in state.standby.standbys:
            obs.standby_reports[sb.number] = [(rs.rank, rec) for rs in sb.ranks for rec in rs.tail.read_records()]
        # 4. control files.
        layout = self.layout
        obs.control = ControlFiles(
            stop_request=os.path.exists(layout.stop_request),
            hold=os.path.exists(layout.hold),
            start_gate_open=os.path.exists(layout.start_gate(state.full_restarts)),
        )
        # 5. the Lighthouse.
        obs.lighthouse_alive = self.lighthouse.alive()
        obs.lighthouse_exit = None if obs.lighthouse_alive else self.lighthouse.exit_code
        # 6. nodes.
        obs.placements = list(self.launcher.take_placements())
        obs.node_states = dict(self.launcher.node_states())
        obs.pending = dict(self.launcher.pending_allocations())
        if self.forks.enabled:
            for g in state.groups:
                if not g.finished:
                    host = self.launcher.fork_host(g.index)
                    if host is not None:
                        obs.fork_hosts[g.index] = host.key
        if Capability.PARTITION in self.launcher.capabilities:
            obs.group_hosts = {g.index: self.launcher.group_host(g.index) for g in active}
        # 7. the helper threads' results, and the signals.
        obs.probe = self.prober.take()
        obs.probe_busy = self.prober.busy
        obs.scrub = self.scrub.results()
        obs.returned_hosts = self.returned_hosts()
        obs.stop_signal = state.watch.stop_reason
        obs.detach_requested = self.takeover.detach_requested
        return obs
