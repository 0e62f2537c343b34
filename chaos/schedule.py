"""Which faults a drill injects and when: an explicit list, or a seeded Poisson schedule.

Same seed, same drill: the schedule's times and kinds, and the draw of targets among
healthy groups, all come from one ``random.Random(seed)``.
"""

from __future__ import annotations

import random

from chaos.config import ChaosConfig
from chaos.kinds import FaultOptions, kind_names, parse_fault
from monarch_ft.records.errors import ConfigError


def build_faults(ch: ChaosConfig) -> list[FaultOptions]:
    """The drill's faults, each its kind's own options (ConfigError, one line, for an entry
    or a scheduled kind that cannot be)."""
    faults = [parse_fault(f, f"chaos.faults[{i}]") for i, f in enumerate(ch.faults)]
    if ch.schedule == "poisson" and ch.count > 0 and ch.rate_per_min > 0:
        kinds = list(ch.kinds) or [FaultOptions.kind]
        for name in kinds:
            if name not in kind_names():
                raise ConfigError(f"chaos.kinds: {name!r}: choose among {', '.join(kind_names())}")
        rng = random.Random(ch.seed)
        t = 0.0
        for _ in range(ch.count):
            t += rng.expovariate(ch.rate_per_min / 60.0)
            faults.append(parse_fault({"kind": rng.choice(kinds), "at_s": round(t, 3)}, "chaos.kinds"))
    return faults


def pick_target(rng: random.Random, healthy: list[int], fault: FaultOptions, allow_last_healthy: bool) -> int | None:
    """The fault's own target if it is healthy, else a seeded draw; never the last healthy group."""
    if not healthy or (len(healthy) == 1 and not allow_last_healthy):
        return None
    if fault.target is not None:
        return fault.target if fault.target in healthy else None
    return rng.choice(sorted(healthy))
