"""``node_down``: the group's node fails as a machine does, and the scheduler sees it: its link cut,
every process on it killed (its slurmd, the job steps, the ranks), its local files gone; Slurm
counts it not responding, then down, by its own pings. The controller does not wait for that: it
sees the ranks gone, keeps new allocations off the node, and recovers the group on another node.
After ``duration_s`` the node comes back (slurmd started again, resumed) and returns to the pool;
with ``back_after_next_s``, that many seconds after the drill's next fault fired instead.
Needs launcher=slurm on a local cluster of simulated nodes (``python -m monarch_ft.testing.slurm_cluster
--nodes N DIR``); the ``node`` kind does the same there, with the default duration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from chaos.kinds.base import FaultCategory, FaultKind, FaultOptions
from monarch_ft.controller.control import NODE_DOWN_S
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.recovered import RESTARTED

# How long a node whose return waits for the next fault is held down meanwhile: a bound, never
# reached in a drill that ends (close() brings back every node still down).
HELD_S = 24 * 3600.0


@dataclass
class NodeDownOptions(FaultOptions):
    duration_s: float = NODE_DOWN_S
    """Seconds until the node comes back (its slurmd started again, the node resumed): longer
    than the scheduler takes to count it down (about 11 s on the local cluster), to see that."""

    back_after_next_s: Optional[float] = None
    """Seconds after the drill's next fault fires that the node comes back, in place of
    ``duration_s``: for a sequence whose next fault must find this node still down whatever
    that fault waits for (a standby built beside busy processes took 57 s where 45 s of
    ``duration_s`` had been enough on a quiet machine). null: ``duration_s`` after this fault."""

    def check(self, where: str) -> None:
        if self.duration_s <= 0:
            raise ConfigError(f"{where}.duration_s={self.duration_s}: must be > 0 (seconds until the node comes back)")
        if self.back_after_next_s is not None and self.back_after_next_s <= 0:
            raise ConfigError(f"{where}.back_after_next_s={self.back_after_next_s}: must be > 0 (seconds after the next fault), or null")


class NodeDown(FaultKind):
    name = "node_down"
    category = FaultCategory.RESTART
    options = NodeDownOptions
    recovery = RESTARTED
    costs_restart = True

    def check(self, fault, cfg, traits, where: str) -> None:
        if not traits.node_faults:
            raise ConfigError(
                f"{where}.kind=node_down: needs nodes that can fail, a local Slurm cluster of simulated nodes: start one with "
                "python -m monarch_ft.testing.slurm_cluster --nodes 4 DIR and run with launcher=slurm launcher.options.slurm_conf=DIR/etc/slurm.conf"
            )

    def needs_next(self, fault) -> bool:
        return fault.back_after_next_s is not None

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        # Held down until the next fault says when (after_next); the launcher's close brings
        # back any node still down at the end.
        return job.kill_host(group, HELD_S if fault.back_after_next_s is not None else fault.duration_s)

    def after_next(self, job, fault, details: dict[str, Any]) -> None:
        if fault.back_after_next_s is not None:
            job.restore_host_after(details, fault.back_after_next_s)


KIND = NodeDown()
