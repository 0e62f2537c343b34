"""The goodput bench's pure parts (recipes/goodput_bench.py): its arms, the Poisson faults of a cell,
and a cell's figures. Goodput itself is monarch_ft.records.goodput's, the drill report's too.

A cell is one job of ``seconds`` wall time (from its first commit) under one arm with faults at one
rate. Every arm of a rate gets the same faults (one seeded draw), so arms differ only in how they
recover. The fault-free rate every ratio divides by is measured in the same run, by a cell with no
faults under the ``live`` arm (no standby: the standby's own cost then shows in the standby arm's
fault-free cell, below 1), run before each rate's cells and once more after the last (:func:`plan_cells`):
a cell divides by the mean of the two references around it. A shared machine's load drifts over a
half-hour run (two references 20 minutes apart once read 6.0 and 16.9 group-steps/s here); references
a few minutes either side of a cell see the load it saw.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Optional

from monarch_ft.records.goodput import goodput, goodput_ratio

# An arm: the overrides that set how a failed group comes back.
ARMS = {
    # Live recovery through a warm standby group (the defaults).
    "live_standby": ("ft.recovery=live", "ft.standby_groups=1"),
    # Live recovery without a standby: relaunches fork from the warm fork server.
    "live": ("ft.recovery=live", "ft.standby_groups=0"),
    # Every group stopped and resumed from the last disk checkpoint (torchrun/TorchElastic's way).
    "full_restart": ("ft.recovery=full_restart",),
}
# The arm the fault-free cell runs (its rate divides every cell's goodput).
REFERENCE_ARM = "live"

# No fault is drawn in a cell's last seconds: one injected there would be cut off by the cell's end
# before its recovery, which the next cell's fault-free start would not see either.
TAIL_S = 10.0


@dataclass(frozen=True)
class Planned:
    """One cell of the plan.

    Args:
        arm, rate_per_min: which cell (a reference is ``REFERENCE_ARM`` at 0).
        reference: a fault-free reference cell.
        before, after: for a measured cell, the plan indices of the references around it.
    """

    arm: str
    rate_per_min: float
    reference: bool = False
    before: int = -1
    after: int = -1


def plan_cells(rates: Iterable[float], arms: Iterable[str]) -> list[Planned]:
    """The cells in running order: a fault-free reference, one rate's arms, a reference, the next rate's
    arms, ..., a reference. Rate 0 runs with the lowest other rate (its only cell is the standby arm's
    own cost: ``live`` and ``full_restart`` without faults are the reference job itself)."""
    rates, arms = sorted(set(rates)), list(arms)
    blocks = [[(a, r) for a in arms if not (r == 0 and a in (REFERENCE_ARM, "full_restart"))] for r in rates]
    if len(blocks) > 1 and rates[0] == 0:
        blocks = [blocks[0] + blocks[1], *blocks[2:]]
    blocks = [b for b in blocks if b]
    plan: list[Planned] = [Planned(REFERENCE_ARM, 0.0, reference=True)]
    for block in blocks:
        before = len(plan) - 1
        after = before + len(block) + 1
        plan += [Planned(a, r, before=before, after=after) for a, r in block]
        plan.append(Planned(REFERENCE_ARM, 0.0, reference=True))
    return plan


def reference_rate(cell: Planned, measured: dict[int, float]) -> Optional[float]:
    """The fault-free rate ``cell`` divides by: the mean of the references around it measured so far
    (``measured``: plan index -> group-steps/s), None before the first."""
    around = [measured[i] for i in (cell.before, cell.after) if i in measured]
    return sum(around) / len(around) if around else None


def poisson_faults(rate_per_min: float, seconds: float, seed: int, kinds: Iterable[str]) -> list[dict]:
    """The faults of a cell: Poisson arrivals at ``rate_per_min`` in ``[0, seconds - TAIL_S)``, each of a
    kind drawn uniformly from ``kinds`` (``kind:mode``), as ``chaos.faults`` entries with ``at_s``."""
    kinds = list(kinds)
    if rate_per_min <= 0:
        return []
    rng = random.Random(f"{seed}:{rate_per_min}")
    faults, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_min / 60.0)
        if t >= seconds - TAIL_S:
            return faults
        kind, _, mode = rng.choice(kinds).partition(":")
        # On schedule, standby ready or not: a fault rate does not wait for the standby to be rebuilt
        # (a fault then takes the path with no standby, as it would in production).
        faults.append({"kind": kind, **({"mode": mode} if mode else {}), "at_s": round(t, 3), "wait_standby": False})


def faults_override(faults: list[dict]) -> str:
    """``chaos.faults=[...]`` for the drill recipe's command line."""
    entries = ["{" + ", ".join(f"{k}: {v}" for k, v in f.items()) + "}" for f in faults]
    return "chaos.faults=[" + ", ".join(entries) + "]"


@dataclass(frozen=True)
class Cell:
    """One cell's figures.

    Args:
        arm, rate_per_min: which cell.
        faults, injected: faults drawn, and injected before the cell ended (a fault waits for the
            previous one's recovery: a slow arm gets fewer at a high rate).
        rate: committed group-steps per second over the cell's window.
        ratio: ``rate`` over the fault-free cell's (None for that cell until it is known).
        ettr: the share of the window's group-seconds spent in committed steps.
    """

    arm: str
    rate_per_min: float
    faults: int
    injected: int
    rate: Optional[float]
    ratio: Optional[float]
    ettr: Optional[float]


def cell_figures(
    arm: str, rate_per_min: float, metrics: list[dict], groups: int, start: float, seconds: float, faults: int, injected: int, fault_free: Optional[float]
) -> Cell:
    """A cell's goodput over ``[start, start + seconds]`` (``start``: its first commit) and its ratio to ``fault_free``."""
    g = goodput(metrics, groups, start=start, end=start + seconds)
    rate = g.rate if g else None
    return Cell(arm, rate_per_min, faults, injected, rate, goodput_ratio(rate, fault_free), g.ettr if g else None)


def closing_line(cells: list[Cell], rate_per_min: float = 2.0) -> str:
    """``goodput_standby_at_2pm=R goodput_full_restart_at_2pm=R`` (``n/a`` for a cell not run)."""

    def ratio(arm: str) -> str:
        found = [c.ratio for c in cells if c.arm == arm and c.rate_per_min == rate_per_min and c.ratio is not None]
        return f"{found[0]:.3f}" if found else "n/a"

    rate = f"{rate_per_min:g}"
    return f"goodput_standby_at_{rate}pm={ratio('live_standby')} goodput_full_restart_at_{rate}pm={ratio('full_restart')}"
