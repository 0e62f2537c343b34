"""``slow``: a fail-slow fault. One rank, or its whole group (``scope: group``), gets
``cpu_fraction`` of a CPU for ``duration_s``, then its full CPU back; no process is touched
otherwise. Every group then waits for it at each cross-group allreduce: the job slows down
without failing, which the hang model ignores by design and the straggler detector
(``ft.straggler``) names, and under ``ft.straggler=evict`` replaces by a standby.

A cgroup CPU quota where the machine allows it, else a SIGSTOP/SIGCONT duty cycle from the
controller (monarch_ft.common.throttle); ``fault_injected`` says which ran (``mechanism``),
``slowdown_ended`` when it was lifted. Recovered at the target group's first commit with the
others after the limit is lifted (an evicted group's standby is back long before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chaos.kinds.base import FaultCategory, FaultKind, FaultOptions
from monarch_ft.common.throttle import ThrottleMechanism, cgroup_problem
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.recovered import RecoveryRule

SCOPES = ("rank", "group")


@dataclass
class SlowOptions(FaultOptions):
    MECHANISMS: ClassVar[tuple[str, ...]] = tuple(m.value for m in ThrottleMechanism)

    cpu_fraction: float = 0.3
    """The fraction of its CPU the target keeps, in (0, 1): of the CPU it used just before the
    fault (measured over half a second), so that on a loaded machine it still slows; 0.3 runs a
    CPU-bound rank about 3x slower."""

    duration_s: float = 30.0
    """Seconds the limit holds before it is lifted."""

    scope: str = "rank"
    """``rank``: only ``rank`` of the target group; ``group``: every rank of it (its whole host)."""

    mechanism: str = "auto"
    """``auto``: a cgroup CPU quota where the machine allows it, else the SIGSTOP/SIGCONT duty
    cycle; ``cgroup`` or ``sigstop`` to force one (``cgroup`` is refused where it cannot run)."""

    def check(self, where: str) -> None:
        if not 0 < self.cpu_fraction < 1:
            raise ConfigError(f"{where}.cpu_fraction={self.cpu_fraction}: must be between 0 and 1 (a fraction of one CPU)")
        if self.duration_s <= 0:
            raise ConfigError(f"{where}.duration_s={self.duration_s}: must be > 0 (how long the CPU stays limited)")
        if self.scope not in SCOPES:
            raise ConfigError(f"{where}.scope={self.scope!r}: choose one of {', '.join(SCOPES)}")
        if self.mechanism not in self.MECHANISMS:
            raise ConfigError(f"{where}.mechanism={self.mechanism!r}: choose one of {', '.join(self.MECHANISMS)}")


class Slow(FaultKind):
    name = "slow"
    category = FaultCategory.IN_PLACE
    options = SlowOptions
    recovery = RecoveryRule(marker=EventKind.SLOWDOWN_ENDED)
    # Under ft.straggler=evict the slow group is failed and replaced: one restart of its budget.
    costs_restart = True

    def check(self, fault, cfg, traits, where: str) -> None:
        if not traits.ranks_on_this_machine or traits.worker_thread_trainer:
            # It limits rank processes of this machine, each a process of its own.
            raise ConfigError(f"{where}.kind=slow: limits the CPU of rank processes on this machine: use launcher=local or local_hosts")
        if fault.mechanism == ThrottleMechanism.CGROUP:
            problem = cgroup_problem()
            if problem:
                raise ConfigError(f"{where}.mechanism=cgroup: {problem}: use mechanism: auto (a SIGSTOP duty cycle) or sigstop")

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        rank = fault.rank if fault.scope == "rank" else None
        return {**job.slow_cpu(group, rank, fault.cpu_fraction, fault.duration_s, fault.mechanism), "scope": fault.scope}


KIND = Slow()
