"""``partition``: the group's host drops off the network (its link down) for ``duration_s``, then
comes back. One longer than the supervisor's hang timeout may still end in a restart, so it
counts against the restart budget."""

from __future__ import annotations

from typing import Any

from chaos.kinds.base import NetworkFault


class Partition(NetworkFault):
    name = "partition"
    costs_restart = True

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.partition(group, fault.duration_s)


KIND = Partition()
