"""The goodput bench's pure parts (monarch_ft/recipes/goodput_bench.py): its arms and plan, the faults of a cell,
a cell's figures and the summary with intervals. Goodput and ETTR themselves are
monarch_ft.records.goodput's (the drill report's too); intervals are monarch_ft.records.stats'.

**Cells.** A cell is one job of ``cell_s`` seconds of wall time from its launch (the process started)
to the stop the bench asks for; its goodput runs from the launch to its last useful commit
(monarch_ft.records.goodput: warm-up charged, rolled-back steps counted once, discarded ones zero).
A job that ended before the stop is charged up to the cell's planned end.

**Plan.** Each repetition runs every arm at every rate, the fault-free rate 0 included (each arm's own
reference), and one cell of plain no-FT training (:data:`NOFT`: the reference of the whole approach),
interleaved arm by arm (A B C A B C ...); odd repetitions run in reverse order, so that a drift of the
machine's speed over the run falls on every arm alike. Each repetition has its own seed: the same
faults for every arm of a rate within it, new faults in the next.

**Faults.** Poisson arrivals at the rate over the whole cell (no quiet tail), each of a kind drawn
from the mix, injected on schedule whatever is still recovering (``chaos.overlap``), on any running
group, the last healthy one too: the rate on the label is the rate applied, and the realised rate
(faults injected per minute of training) is reported beside it. Faults the job never got back from
are reported, never dropped.

**Figures.** Per arm and rate: goodput over the same arm's fault-free cells and over no-FT training
(each the ratio of the means over the repetitions), per provisioned replica over no-FT's (standbys
count as replicas held), ETTR at the arm's fault-free median step time, each with a 95% bootstrap
interval whose unit is a repetition (its faulted cell with the references of the same repetition).
Beside them, what the faults cost each cell against its own pace between them
(monarch_ft.records.goodput.own_pace_kept): blind to costs outside the faults' spans, but not to the
machine's speed moving between cells, which the ratios to other cells need many repetitions to average
out. A fault-free cell's reads about 1: the check of that figure's own error.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

from monarch_ft.records.goodput import goodput, median_step_s, own_pace_kept, rollbacks_of
from monarch_ft.records.stats import bootstrap_ci, mean


@dataclass(frozen=True)
class Arm:
    """One way to run the job.

    Args:
        overrides: the job overrides that make it (on top of the drill's small job).
        standbys: warm standby groups it holds (provisioned beside the training groups).
        label: how the page names it.
        key: its name in the closing line (``goodput_<key>_at_2pm``).
    """

    overrides: tuple[str, ...]
    standbys: int
    label: str
    key: str


ARMS: dict[str, Arm] = {
    # Live recovery through a warm standby group (the defaults); its replacement standby forked
    # from the host's fork server.
    "live_standby": Arm(("ft.recovery=live", "ft.standby_groups=1"), 1, "hsdp, live recovery, a warm standby", "standby"),
    # Every group stopped and resumed from the last disk checkpoint (torchrun/TorchElastic's way).
    "full_restart": Arm(("ft.recovery=full_restart",), 0, "hsdp, full restart from the last checkpoint", "full_restart"),
    # DiLoCo (torchft's semi-sync): each group steps alone, syncing every ft.sync_every steps; a standby.
    "diloco_standby": Arm(("ft.mode=diloco", "ft.recovery=live", "ft.standby_groups=1"), 1, "diloco, live recovery, a warm standby", "diloco_standby"),
    # Live recovery without a standby: relaunches fork from the warm fork server.
    "live": Arm(("ft.recovery=live", "ft.standby_groups=0"), 0, "hsdp, live recovery, no standby (warm fork)", "live"),
}
DEFAULT_ARMS = ("live_standby", "full_restart", "diloco_standby")
# Plain training without torchft (benchmarks/noft_train.py): fault-free only, once per repetition.
NOFT = "noft"
NOFT_LABEL = "no-FT: plain HSDP under torchrun, no torchft, no checkpoints"


@dataclass(frozen=True)
class Planned:
    """One cell of the plan.

    Args:
        arm: an :data:`ARMS` key, or :data:`NOFT`.
        rate_per_min: faults per minute (0: a fault-free cell).
        repetition: which repetition (0-based).
        seed: the repetition's seed (its faults).
    """

    arm: str
    rate_per_min: float
    repetition: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}@{self.rate_per_min:g}/min#{self.repetition}"


def plan_cells(rates: Iterable[float], arms: Sequence[str], repetitions: int, seed: int) -> list[Planned]:
    """The cells in running order: per repetition the no-FT cell, then every (rate, arm) with the arms
    innermost (rate 0 always: each arm's own fault-free cells); odd repetitions reversed.

    Args:
        rates: faults per minute (0 is added if missing).
        arms: the arms, in order.
        repetitions: how many times the whole block runs (one seed each).
        seed: the first repetition's seed (the next ones count up from it).
    """
    rates = sorted(set(rates) | {0.0})
    plan: list[Planned] = []
    for rep in range(repetitions):
        block = [Planned(NOFT, 0.0, rep, seed + rep)] + [Planned(a, float(r), rep, seed + rep) for r in rates for a in arms]
        plan += reversed(block) if rep % 2 else block
    return plan


def poisson_faults(rate_per_min: float, seconds: float, seed: int, kinds: Iterable[str]) -> list[dict]:
    """The faults of a cell: Poisson arrivals at ``rate_per_min`` over ``[0, seconds)`` of training
    (``at_s``: seconds after the job's first step), each of a kind drawn uniformly from ``kinds``
    (``kind:mode``), as ``chaos.faults`` entries. None is held back near the end: one the cell ends
    on before it recovers is reported as such. The same seed and rate give the same faults."""
    kinds = list(kinds)
    if rate_per_min <= 0:
        return []
    rng = random.Random(f"{seed}:{rate_per_min}")
    faults, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_min / 60.0)
        if t >= seconds:
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
class FaultOutcome:
    """What became of one fault of a cell.

    Args:
        kind: ``kind`` or ``kind:mode``.
        at_s: when it was due (seconds after the first step).
        injected: it fired.
        recovered: its group was back (monarch_ft.records.recovered's rule) before the job ended.
        mttr_s: its MTTR (None: not back).
        why: for one not recovered or never fired, the drill's reason.
    """

    kind: str
    at_s: float
    injected: bool
    recovered: bool
    mttr_s: Optional[float]
    why: Optional[str] = None


def fault_outcomes(drill: dict, never_s: float) -> list[FaultOutcome]:
    """The faults of a cell's ``drill.json``, the bench's placeholder that keeps the drill open left out.

    Args:
        drill: the cell's drill.json.
        never_s: the placeholder fault's ``at_s``.
    """
    out = []
    for f in drill.get("faults") or []:
        if (f.get("at_s") or 0) >= never_s:
            continue
        kind = f["kind"] + (f":{f['mode']}" if f.get("mode") else "")
        why = (f.get("not_recovered") or f.get("not_injected") or {}).get("detail")
        out.append(FaultOutcome(kind, float(f.get("at_s") or 0.0), bool(f.get("injected")), f.get("recovered") is True, f.get("mttr_s"), why))
    return out


@dataclass(frozen=True)
class CellFigures:
    """One cell's figures.

    Args:
        arm, rate_per_min, repetition, seed: which cell.
        launched_at: when the bench started the job's process.
        seconds: the goodput window (launch to the last useful commit, or to the planned end for a
            job that ended early).
        training_s: from the first commit to the stop (or the job's end): the faults' span.
        useful, trained, rolled_back: group-steps (monarch_ft.records.goodput.Lineage).
        rate: useful group-steps per second; per_provisioned: over the replicas held.
        tokens_per_s: useful tokens per second.
        provisioned: replica groups held (groups + standbys).
        median_step_s: this cell's own median step time (a fault-free cell's is its arm's pace).
        faults: what became of each fault due in the cell (scheduled within ``training_s``).
        ended_early: the job exited before the stop (exit code in ``exit_code``).
        exit_code: the job's exit code.
        own_pace: the useful group-steps it kept against its own pace between its faults
            (monarch_ft.records.goodput.own_pace_kept; None: no second outside their spans).
    """

    arm: str
    rate_per_min: float
    repetition: int
    seed: int
    launched_at: float
    seconds: Optional[float]
    training_s: Optional[float]
    useful: int
    trained: int
    rolled_back: int
    rate: Optional[float]
    per_provisioned: Optional[float]
    tokens_per_s: Optional[float]
    provisioned: int
    median_step_s: Optional[float]
    faults: list[FaultOutcome] = field(default_factory=list)
    ended_early: bool = False
    exit_code: Optional[int] = None
    own_pace: Optional[float] = None

    @property
    def injected(self) -> int:
        return sum(1 for f in self.faults if f.injected)

    @property
    def not_recovered(self) -> int:
        return sum(1 for f in self.faults if f.injected and not f.recovered)

    @property
    def not_injected(self) -> int:
        return sum(1 for f in self.faults if not f.injected)

    def as_dict(self) -> dict:
        return {**asdict(self), "injected": self.injected, "not_recovered": self.not_recovered, "not_injected": self.not_injected}


def cell_figures(
    planned: Planned,
    metrics: list[dict],
    events: list[dict],
    launched_at: float,
    planned_end: float,
    stopped_at: float,
    groups: int,
    provisioned: int,
    tokens_per_group_step: int,
    faults: Sequence[FaultOutcome] = (),
    exit_code: Optional[int] = 0,
    ended_early: bool = False,
) -> CellFigures:
    """A cell's figures from its records.

    Args:
        planned: the cell.
        metrics, events: its run's step records and events.
        launched_at: when its process was started (goodput's window starts there).
        planned_end: ``launched_at`` + the cell's seconds.
        stopped_at: when the bench asked it to stop (or saw it end).
        groups, provisioned: replica groups training, and held (standbys included).
        tokens_per_group_step: tokens of one group-step.
        faults: the cell's faults (all drawn; those due after the stop are left out here).
        exit_code: the job's exit code.
        ended_early: it exited before the stop: its window runs to ``planned_end``.
    """
    rollbacks = rollbacks_of(events)
    end = planned_end if ended_early else None
    g = goodput(metrics, launched_at, groups, provisioned, end=end, rollbacks=rollbacks, tokens_per_group_step=tokens_per_group_step)
    first = min((m["time"] for m in metrics if m.get("rank") == 0 and m.get("committed")), default=None)
    training_s = stopped_at - first if first is not None and stopped_at > first else None
    due = [f for f in faults if training_s is not None and f.at_s < training_s]
    own = own_pace_kept(metrics, events, rollbacks)
    return CellFigures(
        arm=planned.arm,
        rate_per_min=planned.rate_per_min,
        repetition=planned.repetition,
        seed=planned.seed,
        launched_at=launched_at,
        seconds=g.seconds if g else None,
        training_s=training_s,
        useful=g.useful if g else 0,
        trained=g.trained if g else 0,
        rolled_back=g.rolled_back if g else 0,
        rate=g.rate if g else 0.0,
        per_provisioned=g.rate_per_provisioned if g else 0.0,
        tokens_per_s=g.tokens_per_s if g else 0.0,
        provisioned=provisioned,
        median_step_s=median_step_s(metrics),
        faults=list(due),
        ended_early=ended_early,
        exit_code=exit_code,
        own_pace=own.kept if own is not None else None,
    )


@dataclass(frozen=True)
class Estimate:
    """A figure over repetitions: its point value and 95% bootstrap interval.

    Args:
        value: the point estimate (None: nothing to estimate from).
        lo, hi: the interval (None: too few repetitions).
        n: the repetitions it rests on.
    """

    value: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    n: int

    def text(self, digits: int = 3) -> str:
        if self.value is None:
            return "n/a"
        ci = f" [{self.lo:.{digits}f}, {self.hi:.{digits}f}]" if self.lo is not None else " (no interval: n < 3)"
        return f"{self.value:.{digits}f}{ci}"


def ratio_of_means(pairs: Sequence[tuple[float, float]]) -> Optional[float]:
    """mean(a) / mean(b) over (a, b) pairs; None when the denominator is 0 or there are none."""
    den = sum(b for _, b in pairs)
    return sum(a for a, _ in pairs) / den if pairs and den > 0 else None


def ratio_estimate(pairs: Sequence[tuple[float, float]], seed: int = 0) -> Estimate:
    """The ratio of means of (figure, reference) pairs, one per repetition, with a 95% interval
    from resampling the repetitions (each keeps its own reference: the pairing cancels the drift)."""
    return Estimate(ratio_of_means(pairs), *(bootstrap_ci(pairs, ratio_of_means, seed=seed) or (None, None)), len(pairs))


def mean_estimate(values: Sequence[float], seed: int = 0) -> Estimate:
    """The mean with a 95% bootstrap interval."""
    return Estimate(mean(values), *(bootstrap_ci(values, mean, seed=seed) or (None, None)), len(values))


@dataclass(frozen=True)
class Summary:
    """One arm at one rate, over its repetitions.

    Args:
        arm, rate_per_min: which.
        cells: its cells.
        goodput: useful group-steps/s over the same arm's fault-free cells (at rate 0: 1 by definition,
            so its fault-free cells against no-FT are in ``vs_noft``).
        vs_noft: over plain no-FT training's.
        per_provisioned: per provisioned replica, over no-FT's per replica (no spares).
        ettr: at the arm's fault-free median step time.
        realised_rate: faults injected per minute of training (None at rate 0).
        scheduled, injected, recovered, not_recovered, not_injected: fault counts over its cells.
        failed_cells: cells whose job ended before the stop.
        mttr_s: the recovered faults' MTTRs.
        own_pace: the mean over its cells of what each kept against its own pace between faults
            (:attr:`CellFigures.own_pace`), with a 95% bootstrap interval over the cells.
    """

    arm: str
    rate_per_min: float
    cells: int
    goodput: Estimate
    vs_noft: Estimate
    per_provisioned: Estimate
    ettr: Estimate
    realised_rate: Optional[float]
    scheduled: int
    injected: int
    recovered: int
    not_recovered: int
    not_injected: int
    failed_cells: int
    mttr_s: list[float]
    own_pace: Estimate = Estimate(None, None, None, 0)

    def as_dict(self) -> dict:
        return asdict(self)


def arm_pace(cells: Sequence[CellFigures], arm: str) -> Optional[float]:
    """The arm's fault-free median step time: the median of its fault-free cells' own (None: none ran)."""
    paces = sorted(c.median_step_s for c in cells if c.arm == arm and c.rate_per_min == 0 and c.median_step_s is not None)
    return paces[len(paces) // 2] if paces else None


def summarize(cells: Sequence[CellFigures], groups: int) -> list[Summary]:
    """Every (arm, rate) measured, arms in first-seen order, rates ascending (no-FT's own row first).

    Args:
        cells: the cells measured so far.
        groups: replica groups training (ETTR's denominator).
    """
    by = {(c.arm, c.rate_per_min, c.repetition): c for c in cells}
    arms = list(dict.fromkeys(c.arm for c in cells))
    out = []
    for arm in arms:
        pace = arm_pace(cells, arm)
        for rate in sorted({c.rate_per_min for c in cells if c.arm == arm}):
            mine = [c for c in cells if c.arm == arm and c.rate_per_min == rate]
            own, noft, per = [], [], []
            for c in mine:
                ff, nf = by.get((arm, 0.0, c.repetition)), by.get((NOFT, 0.0, c.repetition))
                if ff is not None and ff.rate:
                    own.append((c.rate or 0.0, ff.rate))
                if nf is not None and nf.rate:
                    noft.append((c.rate or 0.0, nf.rate))
                    per.append((c.per_provisioned or 0.0, nf.per_provisioned or 0.0))
            ettr = [c.useful * pace / (groups * c.seconds) for c in mine if pace is not None and c.seconds]
            minutes = sum(c.training_s or 0.0 for c in mine) / 60.0
            faults = [f for c in mine for f in c.faults]
            injected = sum(1 for f in faults if f.injected)
            out.append(
                Summary(
                    arm=arm,
                    rate_per_min=rate,
                    cells=len(mine),
                    goodput=ratio_estimate(own),
                    vs_noft=ratio_estimate(noft),
                    per_provisioned=ratio_estimate(per),
                    ettr=mean_estimate(ettr),
                    realised_rate=injected / minutes if rate > 0 and minutes > 0 else None,
                    scheduled=len(faults),
                    injected=injected,
                    recovered=sum(1 for f in faults if f.injected and f.recovered),
                    not_recovered=sum(1 for f in faults if f.injected and not f.recovered),
                    not_injected=sum(1 for f in faults if not f.injected),
                    failed_cells=sum(1 for c in mine if c.ended_early),
                    mttr_s=[f.mttr_s for f in faults if f.recovered and f.mttr_s is not None],
                    own_pace=mean_estimate([c.own_pace for c in mine if c.own_pace is not None]),
                )
            )
    return out


def realised_rate(cells: Sequence[CellFigures], rate_per_min: float) -> Optional[float]:
    """Faults injected per minute of training over every arm's cells at ``rate_per_min``."""
    mine = [c for c in cells if c.rate_per_min == rate_per_min and c.arm != NOFT]
    minutes = sum(c.training_s or 0.0 for c in mine) / 60.0
    return sum(c.injected for c in mine) / minutes if minutes > 0 else None


def closing_line(summaries: Sequence[Summary], cells: Sequence[CellFigures], rate_per_min: float = 2.0) -> str:
    """``goodput_standby_at_2pm=R goodput_standby_at_2pm_lo=L goodput_standby_at_2pm_hi=H ...
    goodput_full_restart_at_2pm=... goodput_diloco_standby_at_2pm=...
    goodput_standby_per_provisioned_at_2pm=... realised_rate_2pm=F`` (``n/a`` for what was not run)."""
    rate = f"{rate_per_min:g}"
    found = {s.arm: s for s in summaries if s.rate_per_min == rate_per_min}
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    parts = []

    def add(name: str, est: Optional[Estimate]) -> None:
        parts.append(f"{name}={fmt(est.value if est else None)}")
        parts.append(f"{name}_lo={fmt(est.lo if est else None)}")
        parts.append(f"{name}_hi={fmt(est.hi if est else None)}")

    for arm in ("live_standby", "full_restart", "diloco_standby"):
        add(f"goodput_{ARMS[arm].key}_at_{rate}pm", found[arm].goodput if arm in found else None)
    for arm in ("live_standby", "full_restart", "diloco_standby"):
        add(f"own_pace_{ARMS[arm].key}_at_{rate}pm", found[arm].own_pace if arm in found else None)
    add(f"goodput_standby_per_provisioned_at_{rate}pm", found["live_standby"].per_provisioned if "live_standby" in found else None)
    realised = realised_rate(cells, rate_per_min)
    parts.append(f"realised_rate_{rate}pm={'n/a' if realised is None else f'{realised:.2f}'}")
    return " ".join(parts)
