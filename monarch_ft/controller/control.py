"""The narrow, typed handle fault injectors (chaos) and other supervisor hooks get.

Why not the Supervisor itself: a hook that reaches into ``sup.groups[g].ranks[r].proc``
or finds the launcher's hosts with ``getattr`` depends on every detail of the watch loop.
``JobControl`` is what a hook may do to a running job (signal a rank, wipe a host's
files, cut or slow a link where the launcher can, ask a rank for an in-collective fault)
and what it may read (healthy groups, the newest commits, whether weights agree), with
the launcher's :class:`Capability` set saying which of the network faults exist here.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from monarch_ft.launcher.base import Capability
from monarch_ft.records.events import EventKind, GroupStatus
from monarch_ft.records.faults import request_bitflip, request_collective_fault
from monarch_ft.records.members import members_of

if TYPE_CHECKING:
    from monarch_ft.controller.loop import Supervisor

# How long a node a node fault takes down stays down (where the launcher can fail a node:
# Capability.NODE_DOWN) unless the fault says: longer than Slurm takes to count a silent node
# down on the local cluster (monarch_ft.testing.slurm_cluster.NODE_TIMEOUTS), so a drill sees it.
NODE_DOWN_S = 30.0


class JobControl:
    """A hook's view of the running job.

    Args:
        sup: the supervisor this handle acts through (hooks never see it).
    """

    def __init__(self, sup: "Supervisor") -> None:
        self._sup = sup
        # CPU limits this handle set (slow_cpu), lifted by their timers or at close().
        self._throttles: list = []
        # Hosts whose slowness ended, told by the faults' timer threads; the tick takes them.
        self._returned: list[str] = []
        self._returned_lock = threading.Lock()

    # ------------------------------------------------------------ reading
    @property
    def cfg(self):
        return self._sup.cfg

    @property
    def last_commit(self) -> dict[int, dict]:
        """Each group's newest committed step (rank 0): its record's step, time, attempt,
        quorum_id, quorum_size, participating_groups and loss
        (monarch_ft.controller.decide.reports.COMMIT_FIELDS)."""
        return self._sup.state.last_commit

    @property
    def first_step_time(self) -> Optional[float]:
        return self._sup.state.first_step_time

    def standby_pending(self) -> bool:
        """Fewer warm standby groups ready than configured (one is being built or rebuilt)."""
        pool = self._sup.state.standby
        # A warm fork server still importing counts too: a fault then would start cold.
        return len(pool.ready()) < pool.wanted or self._sup.warm_forks.pending()

    def attempt(self, group: int) -> int:
        return self._sup.state.groups[group].attempt

    def healthy_groups(self) -> list[int]:
        """Groups stepping in the newest quorum, not finished: the ones a fault may hit."""
        members: set[int] = set()
        if self.last_commit:
            newest = max(self.last_commit.values(), key=lambda r: r["time"])
            members = set(members_of(newest))
        return [
            g.index
            for g in self._sup.state.groups
            if g.status == GroupStatus.RUNNING and not g.train_done and g.index in members and g.index in self.last_commit
        ]

    def live_groups(self) -> list[int]:
        """Groups whose ranks run (starting, healing or stepping; not finished): what a fault that
        comes on schedule may hit, as one in production can (``chaos.overlap``)."""
        return [
            g.index
            for g in self._sup.state.groups
            if g.active and not g.train_done and g.ranks and all(r.proc is not None and r.exited is None for r in g.ranks)
        ]

    def consistent_at(self, groups: set[int], min_step: int) -> Optional[tuple[int, bool]]:
        """See Supervisor.consistent_at."""
        return self._sup.consistent_at(groups, min_step)

    def events_of(self, kind: str, **match: Any) -> list[dict]:
        return self._sup.events.find(kind, **match)

    @property
    def capabilities(self) -> set[Capability]:
        return set(getattr(self._sup.launcher, "capabilities", set()))

    # ------------------------------------------------------------ acting
    def emit(self, event: EventKind, **fields: Any) -> dict:
        return self._sup.events.emit(event, **fields)

    def finish_at(self, step: int) -> None:
        self._sup.finish_at(step)

    def rank_pid(self, group: int, rank: int) -> Optional[int]:
        return self._sup.state.groups[group].ranks[rank].proc.pid

    def signal_rank(self, group: int, rank: int, sig: int) -> dict:
        """Send ``sig`` to one rank of ``group``; returns what was done, for the event log."""
        rs = self._sup.state.groups[group].ranks[rank]
        pid = rs.proc.pid
        rs.proc.send_signal(sig)
        return {"pid": pid, "signal": signal.Signals(sig).name}

    def capture_stacks(self, groups: Optional[list[int]] = None, tag: str = "on-demand") -> dict[str, str]:
        """Every live rank's Python stacks (of ``groups``, default all) into the run's ``stacks/``; label -> file."""
        return self._sup.capture_stacks(groups, tag)

    def kill_lighthouse(self) -> dict:
        """SIGKILL the Lighthouse server (the supervisor restarts it on the same address)."""
        pid = self._sup.lighthouse.pid
        if pid is None:
            raise RuntimeError("the job has no Lighthouse of its own to kill (ft.lighthouse_addr names an external one)")
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "signal": "SIGKILL", "address": self._sup.lighthouse.address}

    @property
    def run_layout(self):
        """The run directory's paths (monarch_ft.records.layout.RunLayout)."""
        return self._sup.layout

    def kill_host(self, group: int, down_s: Optional[float] = None) -> dict:
        """The group's whole host goes: its ranks and its local files (scratch space and the
        group's checkpoint folder). Where the launcher can fail the node itself
        (:attr:`Capability.NODE_DOWN`: Slurm on a cluster of simulated nodes), the node fails as a
        machine does (its link cut, every process on it killed, its slurmd with them: Slurm
        finds out by itself) and comes back after ``down_s`` (:data:`NODE_DOWN_S` by default,
        a ``node_restored`` event then); elsewhere every rank is SIGKILLed."""
        if Capability.NODE_DOWN in self.capabilities:
            done = self._sup.launcher.node_down(group, NODE_DOWN_S if down_s is None else down_s, on_restore=self._node_restored())
        else:
            pids = []
            for rs in self._sup.state.groups[group].ranks:
                pids.append(rs.proc.pid)
                rs.proc.send_signal(signal.SIGKILL)
            done = {"pids": pids, "signal": "SIGKILL"}
        deleted = []
        for path in (self._sup.layout.scratch(group), self._sup.layout.checkpoint(group)):
            if os.path.exists(path):
                count = sum(len(files) for _, _, files in os.walk(path))
                shutil.rmtree(path)
                deleted.append({"path": path, "files": count})
        return {**done, "deleted": deleted}

    def restore_host_after(self, killed: dict, seconds: float) -> bool:
        """Bring back the node a :meth:`kill_host` took down ``seconds`` from now instead of when it
        was due; False when it is not down (any more).

        Args:
            killed: what that :meth:`kill_host` returned (it names the node).
            seconds: from now until the node is back.
        """
        return self._sup.launcher.restore_node_after(killed["node"], seconds, on_restore=self._node_restored())

    def _node_restored(self) -> Callable[[dict], None]:
        """Called (timer thread) when a node a node fault took down is back."""

        def restored(info: dict) -> None:
            self.emit(EventKind.NODE_RESTORED, time=info["restored_at"], node=info["node"], lasted_s=info["lasted_s"], resumed=info.get("resumed"))

        return restored

    def collective_fault(self, group: int, rank: int, mode: str, duration_s: float) -> dict:
        """Ask one rank to fail its next cross-group allreduce (rank.components.fault_agent)."""
        path = request_collective_fault(self._sup.layout, group, rank, mode, duration_s)
        return {"mode": mode, "request": path, "pid": self.rank_pid(group, rank)}

    def bitflip(self, group: int, rank: int, tensor: str, bit: str, seed: int) -> dict:
        """Ask one rank to flip a bit of its live state at its next step (rank.components.fault_agent)."""
        path = request_bitflip(self._sup.layout, group, rank, tensor, bit, seed)
        return {"tensor": tensor, "bit": bit, "seed": seed, "request": path, "pid": self.rank_pid(group, rank)}

    def _network(self, capability: Capability):
        if capability not in self.capabilities:
            raise RuntimeError(f"a {capability.value} fault needs simulated hosts: use launcher=local_hosts (launcher.options.simulated_hosts=true)")
        return self._sup.launcher

    def _restored(self, group: int, kind: str, host: Optional[str] = None) -> Callable[[dict], None]:
        """Called (timer thread) when the link is back: the event recovery is measured from; a
        slow link's ``host``, if a straggler eviction left it out, may be placed on again."""

        def restored(info: dict) -> None:
            self.emit(EventKind.LINK_RESTORED, time=info["restored_at"], group=group, fault_kind=kind, lasted_s=info["lasted_s"])
            if host is not None:
                self.return_host(host)

        return restored

    def partition(self, group: int, duration_s: float) -> dict:
        launcher = self._network(Capability.PARTITION)
        return launcher.partition(group, duration_s, on_restore=self._restored(group, "partition"))

    def slow_cpu(self, group: int, rank: Optional[int], fraction: float, duration_s: float, mechanism: str) -> dict:
        """Limit one rank of ``group`` (every rank: ``rank`` None) to ``fraction`` of a CPU for
        ``duration_s`` (common.throttle.CpuThrottle); ``slowdown_ended`` is emitted when it is
        lifted, and the group's host, if a straggler eviction left it out, may be placed on again."""
        from monarch_ft.common.throttle import CpuThrottle

        g = self._sup.state.groups[group]
        ranks = [rs for rs in g.ranks if rank is None or rs.rank == rank]
        host = self._sup.launcher.group_host(group)
        # "A fraction of its CPU": of what it uses now (half a second's measure), so that on a
        # loaded machine, where it already gets less than that fraction of a CPU, it still slows.
        throttle = CpuThrottle([rs.proc.pid for rs in ranks], fraction, mechanism, measure_s=0.5)
        self._throttles.append(throttle)

        def lift() -> None:
            info = throttle.stop()
            if not info:
                return
            try:
                self.emit(EventKind.SLOWDOWN_ENDED, group=group, host=host, **info)
                self.return_host(host)
            except Exception:
                pass  # e.g. the event log already closed at the end of the job

        timer = threading.Timer(duration_s, lift)
        timer.daemon = True
        timer.start()
        return {**throttle.describe(), "host": host, "duration_s": duration_s, "ranks": [rs.rank for rs in ranks]}

    def return_host(self, host: str) -> None:
        """``host`` may be placed on again (its slowness ended). Called from a fault's timer
        thread, so it only tells: the next tick observes it (:meth:`take_returned_hosts`) and
        decides ``host_returned`` if it was left out. Changing the job's state here raced the
        tick's own save (the takeover state's check found a host gone mid-save)."""
        with self._returned_lock:
            self._returned.append(host)

    def take_returned_hosts(self) -> list[str]:
        """The hosts told returned since the last call (the observe stage's)."""
        with self._returned_lock:
            taken, self._returned = self._returned, []
        return taken

    def close(self) -> None:
        """Lift every CPU limit still in force (the job is ending: no cgroup is left behind)."""
        for throttle in self._throttles:
            throttle.stop()

    def slow_link(self, group: int, delay_ms: float, rate: Optional[str], duration_s: float) -> dict:
        launcher = self._network(Capability.SLOW_LINK)
        host = launcher.group_host(group)
        return {**launcher.slow_link(group, delay_ms, rate, duration_s, on_restore=self._restored(group, "slow_link", host)), "host": host}
