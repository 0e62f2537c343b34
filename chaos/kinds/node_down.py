"""``node_down``: the group's node fails as a machine does, and the scheduler sees it: its link cut,
every process on it killed (its slurmd, the job steps, the ranks), its local files gone; Slurm
counts it not responding, then down, by its own pings. The controller does not wait for that: it
sees the ranks gone, keeps new allocations off the node, and recovers the group on another node.
After ``duration_s`` the node comes back (slurmd started again, resumed) and returns to the pool.
Needs launcher=slurm on a local cluster of simulated nodes (``python -m monarch_ft.testing.slurm_cluster
--nodes N DIR``); the ``node`` kind does the same there, with the default duration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.kinds.base import FaultCategory, FaultKind, FaultOptions
from monarch_ft.controller.control import NODE_DOWN_S
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.recovered import RESTARTED


@dataclass
class NodeDownOptions(FaultOptions):
    duration_s: float = NODE_DOWN_S
    """Seconds until the node comes back (its slurmd started again, the node resumed): longer
    than the scheduler takes to count it down (about 11 s on the local cluster), to see that."""

    def check(self, where: str) -> None:
        if self.duration_s <= 0:
            raise ConfigError(f"{where}.duration_s={self.duration_s}: must be > 0 (seconds until the node comes back)")


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

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.kill_host(group, fault.duration_s)


KIND = NodeDown()
