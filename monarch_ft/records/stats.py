"""Percentiles, spreads and bootstrap intervals: the one place every report and bench takes them from.

Why one module: a p50 in the drill report, the eviction bench, the scale sweep and the learned hang
timeout must mean the same thing (linear between order statistics, numpy's default), and a figure
quoted with an interval must say how it was drawn. Pure Python on purpose: the controller imports
it every tick (the learned hang timeout) and must not pay for numpy there.

A :class:`Spread` is what a reader needs beside a percentile to judge it: how many values, the
largest one, and a 95% bootstrap interval for the p50 and the p95 (None below
:data:`MIN_FOR_INTERVAL` values: a resample of one or two says nothing).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Optional, Sequence, TypeVar

T = TypeVar("T")

# Resamples per bootstrap interval: enough for the 2.5th/97.5th percentiles to settle to a few
# thousandths, cheap enough for a report (a few milliseconds for tens of values).
RESAMPLES = 2000
# The confidence level of every interval here.
LEVEL = 0.95
# Fewer values than this: no interval (a bootstrap of one or two values is just those values).
MIN_FOR_INTERVAL = 3


def finite(values: Iterable[object]) -> list[float]:
    """The values that are finite numbers, as floats (None, NaN, strings and bools left out)."""
    out = []
    for x in values:
        if x is None or isinstance(x, bool):
            continue
        try:
            v = float(x)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0-100), linear between order statistics (numpy's default); None for no values.

    Args:
        values: the sample (any order).
        q: the percentile, 0 to 100.
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> Optional[float]:
    """The arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


def bootstrap_ci(
    units: Sequence[T],
    statistic: Callable[[Sequence[T]], Optional[float]],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Optional[tuple[float, float]]:
    """A percentile bootstrap interval of ``statistic`` over ``units`` resampled with replacement.

    The unit is whatever varies independently: a value, or a (faulted cell, fault-free cell) pair
    of one repetition when the statistic is a ratio of their means. Seeded, so a report is the same
    every time it is rebuilt from the same records.

    Args:
        units: the sample's independent units.
        statistic: the figure, computed on a resample (None from it: that resample is skipped).
        level: the interval's coverage.
        resamples: how many resamples.
        seed: the resampling's seed.

    Returns:
        (low, high), or None with fewer than :data:`MIN_FOR_INTERVAL` units or no resample that
        gave a figure.
    """
    if len(units) < MIN_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    n = len(units)
    stats = []
    for _ in range(resamples):
        value = statistic([units[rng.randrange(n)] for _ in range(n)])
        if value is not None:
            stats.append(value)
    if not stats:
        return None
    tail = (1.0 - level) / 2 * 100
    return percentile(stats, tail), percentile(stats, 100 - tail)  # type: ignore[return-value]


@dataclass(frozen=True)
class Spread:
    """A sample summarised for a reader: n, mean, p50 and p95 each with its 95% interval, max.

    Args:
        n: how many values.
        mean: their mean.
        p50, p95: the percentiles.
        p50_ci, p95_ci: 95% bootstrap intervals for them (None: fewer than MIN_FOR_INTERVAL values).
        max: the largest value.
    """

    n: int
    mean: Optional[float]
    p50: Optional[float]
    p50_ci: Optional[tuple[float, float]]
    p95: Optional[float]
    p95_ci: Optional[tuple[float, float]]
    max: Optional[float]

    def as_dict(self) -> dict:
        """A JSON-ready dict (intervals as two-element lists)."""
        out = asdict(self)
        for key in ("p50_ci", "p95_ci"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out

    def text(self, digits: int = 2, unit: str = "") -> str:
        """``p50 1.23 [1.10, 1.40], p95 2.00 [1.8, 2.1], max 2.10, n=12`` (``n=0`` alone when empty).

        Args:
            digits: decimals shown.
            unit: appended to each figure (``s``).
        """
        if not self.n:
            return "n=0"
        f = lambda v: f"{v:.{digits}f}{unit}"  # noqa: E731
        ci = lambda c: f" [{f(c[0])}, {f(c[1])}]" if c else ""  # noqa: E731
        return f"p50 {f(self.p50)}{ci(self.p50_ci)}, p95 {f(self.p95)}{ci(self.p95_ci)}, max {f(self.max)}, n={self.n}"


def spread(values: Iterable[object], seed: int = 0) -> Spread:
    """The :class:`Spread` of the finite numbers among ``values`` (the rest are left out).

    Args:
        values: the sample; None, NaN and non-numbers are not counted.
        seed: the bootstrap's seed.
    """
    xs = finite(values)
    if not xs:
        return Spread(0, None, None, None, None, None, None)
    return Spread(
        n=len(xs),
        mean=mean(xs),
        p50=percentile(xs, 50),
        p50_ci=bootstrap_ci(xs, lambda s: percentile(s, 50), seed=seed),
        p95=percentile(xs, 95),
        p95_ci=bootstrap_ci(xs, lambda s: percentile(s, 95), seed=seed),
        max=max(xs),
    )
