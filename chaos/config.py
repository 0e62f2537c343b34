"""Drill configs: the pretrain schema plus a ``chaos`` section (Hydra structured)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from hydra.core.config_store import ConfigStore

from chaos.kinds import FaultOptions, fault_kind, parse_fault
from monarch_ft.config.job import JobConfig
from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import ConfigError


def FaultConfig(**fields: Any) -> FaultOptions:
    """One ``chaos.faults`` entry built in code (``FaultConfig(kind="hang", mode="gil", at_step=5)``):
    its kind's own options, checked as a configured entry is (:func:`chaos.kinds.parse_fault`)."""
    return parse_fault(fields)


@dataclass
class ChaosConfig:
    """A drill's faults (``recipes/drill.py``; the MTTR bench builds them from ``bench`` instead)."""

    faults: List[Any] = field(default_factory=list)
    """The faults, each a mapping: its kind (chaos/kinds: process_kill, hang, ...), when (``at_step``
    or ``at_s``), where (``target``, ``rank``), and its kind's own options (hang's ``mode``,
    partition's ``duration_s``...); a key its kind does not have is refused. Parsed by
    chaos.kinds.parse_fault; the keys are listed under ``chaos.faults`` entries below."""

    schedule: str = "none"
    """``none``: only ``faults``; ``poisson``: also ``count`` faults at ``rate_per_min``, kinds drawn from ``kinds``."""

    rate_per_min: float = 2.0
    """``schedule=poisson``: faults per minute, on average. Refused with ``schedule=none``."""

    count: int = 0
    """``schedule=poisson``: how many faults it draws. Refused with ``schedule=none``."""

    kinds: List[str] = field(default_factory=lambda: [FaultOptions.kind])
    """``schedule=poisson``: the kinds drawn from, uniformly. Refused with ``schedule=none``."""

    seed: int = 0
    """Seeds the Poisson schedule and the draw of targets among healthy groups: same seed, same drill."""

    allow_last_healthy: bool = False
    """Let a fault hit the last healthy group (the job then stops training until it is back); by
    default such a fault waits, and a drill needs ``ft.replica_groups`` >= 2."""

    baseline: bool = False
    """Run the same faults again under ``ft.recovery=full_restart`` (in ``<run>/baseline``) and compare.
    Refused when the drill itself runs under ``full_restart``."""

    recovery_timeout_s: float = 120.0
    """Seconds after which a fault whose recovery has not finished counts as not recovered."""

    on_demand: bool = False
    """Faults may also be asked for while the drill runs (``monarch_ft.launch(...).inject``; read from
    ``control/fault_requests/``): the drill may start with none, and trains until ``training.steps`` or a
    ``stop`` instead of ending after its last fault."""

    tail_steps: int = 10
    """Steps trained after the last fault has recovered, before the drill finishes."""

    overlap: bool = False
    """false: a fault fires only once the previous one has recovered, on a healthy group, so each
    MTTR is measured on its own (a drill's phases need that). true: every fault fires when its
    trigger comes, recovering peers or not, on any group whose ranks are running (a starting or
    healing one too), as faults arrive in production: the goodput bench's schedule is then the
    rate applied. The last healthy group is still spared unless ``allow_last_healthy``."""


@dataclass
class DrillConfig(JobConfig):
    """A fault drill: a training job (every section of :class:`JobConfig`) and its faults."""

    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    """The drill's faults and how they are scheduled."""


def register_drill_configs() -> None:
    ConfigStore.instance().store(name="drill_schema", node=DrillConfig)


def validate_chaos(cfg: DrillConfig, faults: list[FaultOptions]) -> None:
    """Impossible drills fail here, before anything is launched. Each fault's options were
    checked on their own when parsed (:func:`chaos.schedule.build_faults`); here they meet the
    job: its groups and ranks, its steps, its launcher's traits, the restart budget."""
    from monarch_ft.launcher import launcher_traits

    ch, ft = cfg.chaos, cfg.ft
    if ch.schedule not in ("none", "poisson"):
        raise ConfigError(f"chaos.schedule={ch.schedule!r}: choose none or poisson")
    if ch.rate_per_min <= 0:
        raise ConfigError(f"chaos.rate_per_min={ch.rate_per_min}: must be > 0")
    if ch.count < 0:
        raise ConfigError(f"chaos.count={ch.count}: must be >= 0")
    if ch.schedule == "none" and ch.count:
        raise ConfigError("chaos.count is set but chaos.schedule=none: add chaos.schedule=poisson")
    if ch.schedule == "none":
        refuse_unused(
            ch, "chaos", ("rate_per_min", "kinds"), "with chaos.schedule=none (only chaos.faults are injected)", "drop it, or add chaos.schedule=poisson"
        )
    if ft.recovery == "full_restart":
        refuse_unused(ch, "chaos", ("baseline",), "with ft.recovery=full_restart (the drill is the full-restart baseline)", "drop it, or use ft.recovery=live")
    if not faults and not ch.on_demand:
        raise ConfigError("the drill has no faults: give chaos.faults=[{kind: process_kill, at_step: 10}] or chaos.schedule=poisson chaos.count=N")
    if ft.replica_groups < 2 and not ch.allow_last_healthy:
        raise ConfigError("a drill needs ft.replica_groups >= 2 (one group keeps training), or chaos.allow_last_healthy=true")
    traits = launcher_traits(cfg.launcher)
    for i, f in enumerate(faults):
        where = f"chaos.faults[{i}]"
        if f.target is not None and not 0 <= f.target < ft.replica_groups:
            raise ConfigError(f"{where}.target={f.target}: no such group (ft.replica_groups={ft.replica_groups})")
        if not 0 <= f.rank < ft.ranks_per_group:
            raise ConfigError(f"{where}.rank={f.rank}: no such rank (ft.ranks_per_group={ft.ranks_per_group})")
        if (f.at_step is None) == (f.at_s is None):
            raise ConfigError(f"{where}: give exactly one of at_step or at_s")
        if f.at_step is not None and not 0 <= f.at_step < cfg.training.steps:
            raise ConfigError(f"{where}.at_step={f.at_step}: must be below training.steps={cfg.training.steps}")
        if f.at_s is not None and f.at_s < 0:
            raise ConfigError(f"{where}.at_s={f.at_s}: must be >= 0")
        fault_kind(f.kind).check(f, cfg, traits, where)
        if fault_kind(f.kind).needs_next(f) and i == len(faults) - 1:
            raise ConfigError(f"{where}: timed from the drill's next fault (back_after_next_s) but the last one: add a fault after it, or use duration_s")
    restarting = [f for f in faults if fault_kind(f.kind).costs_restart]
    # A full restart consumes one restart of every group; live recovery one of the target's
    # (a fault without a target may hit any group). The budget is ft.max_restarts within
    # ft.restart_window_s: the group whose faults crowd one window the most is the worst case.
    everyone = ft.recovery == "full_restart" or ch.baseline
    span = ft.restart_window_s + ft.startup_timeout_s
    worst = max((restarts_in_one_window([f for f in restarting if everyone or f.target in (g, None)], span) for g in range(ft.replica_groups)), default=0)
    if worst > ft.max_restarts:
        raise ConfigError(
            f"the drill's {len(restarting)} restarting faults need up to {worst} restarts of one group within ft.restart_window_s={ft.restart_window_s:g} "
            f"but ft.max_restarts={ft.max_restarts}: raise ft.max_restarts or inject fewer faults"
        )


def restarts_in_one_window(faults: list[FaultConfig], span_s: float) -> int:
    """The most of ``faults`` whose restarts may fall within one restart window.

    A fault given by ``at_s`` is restarted a detection after it; one given by ``at_step`` has
    no known time, so it may fall in any window and counts in every one. ``span_s`` is the
    window plus the longest detection (``ft.startup_timeout_s``): two faults that far apart
    may still see their restarts closer than the window.
    """
    timed = sorted(f.at_s for f in faults if f.at_s is not None)
    untimed = len(faults) - len(timed)
    return untimed + max((sum(1 for t in timed if 0 <= t - start < span_s) for start in timed), default=0)
