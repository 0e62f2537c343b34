"""Which faults a drill injects and when: an explicit list, or a seeded Poisson schedule.

Same seed, same drill: the schedule's times and kinds, and the draw of targets among
healthy groups, all come from one ``random.Random(seed)``.
"""

from __future__ import annotations

import random

from chaos.config import ChaosConfig, FaultConfig


def build_faults(ch: ChaosConfig) -> list[FaultConfig]:
    faults = [FaultConfig(**vars(f)) if not isinstance(f, FaultConfig) else f for f in ch.faults]
    if ch.schedule == "poisson" and ch.count > 0 and ch.rate_per_min > 0:
        rng = random.Random(ch.seed)
        t = 0.0
        kinds = list(ch.kinds) or ["process_kill"]
        for _ in range(ch.count):
            t += rng.expovariate(ch.rate_per_min / 60.0)
            faults.append(FaultConfig(kind=rng.choice(kinds), at_s=round(t, 3)))
    return faults


def pick_target(rng: random.Random, healthy: list[int], fault: FaultConfig, allow_last_healthy: bool) -> int | None:
    """The fault's own target if it is healthy, else a seeded draw; never the last healthy group."""
    if not healthy or (len(healthy) == 1 and not allow_last_healthy):
        return None
    if fault.target is not None:
        return fault.target if fault.target in healthy else None
    return rng.choice(sorted(healthy))
