"""``collective``: one rank fails its next cross-group allreduce; no process is restarted.

A fault inside a collective cannot be done from outside: the injector drops a request file
for the rank, and the rank's fault agent acts on it at its next allreduce (and reports
``collective_fault_injected``). Modes: ``abort`` (the default) aborts the rank's TorchFT
process group mid-step; ``hang`` stalls before the allreduce for ``duration_s`` (longer than
ft.timeout_s), so the peers' collective times out. TorchFT must discard the step and
reconfigure; the fault is recovered at the group's first commit with the others after the
rank acted on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chaos.kinds.base import FaultCategory, FaultKind, ModeOptions
from monarch_ft.records.events import EventKind
from monarch_ft.records.recovered import RecoveryRule


@dataclass
class CollectiveOptions(ModeOptions):
    MODES: ClassVar[tuple[str, ...]] = ("abort", "hang")
    duration_s: float = 15.0
    """Mode ``hang``: seconds the rank stalls before joining the allreduce (above ``ft.timeout_s``,
    so the others' collective times out). Unused in mode ``abort``."""


class Collective(FaultKind):
    name = "collective"
    category = FaultCategory.IN_PLACE
    options = CollectiveOptions
    recovery = RecoveryRule(marker=EventKind.COLLECTIVE_FAULT_INJECTED)
    rank_action = "take the request at its next cross-group allreduce: abort its process group, or stall for duration_s"

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.collective_fault(group, fault.rank, fault.mode, fault.duration_s)


KIND = Collective()
