"""``node``: the whole host goes: every rank of the group at once, and its local files
(scratch space and the group's checkpoint folder). Under launcher=slurm on a cluster of simulated
nodes the node itself fails, as ``node_down`` does (Slurm sees it), and comes back after
``node_down``'s default duration."""

from __future__ import annotations

from typing import Any

from chaos.kinds.base import FaultCategory, FaultKind
from monarch_ft.records.recovered import RESTARTED


class Node(FaultKind):
    name = "node"
    category = FaultCategory.RESTART
    recovery = RESTARTED
    costs_restart = True

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.kill_host(group)


KIND = Node()
