"""MTTR benchmark: one run sweeps recovery modes x fault kinds, with repeats, into one report.

    monarch-ft mttr-bench hydra.run.dir=outputs/sweep
    monarch-ft mttr-bench 'bench.modes=[live,full_restart]' 'bench.kinds=[process_kill,hang:gil]' bench.repeats=1
    monarch-ft mttr-bench -m ft.mode=hsdp,diloco ft.sync_every=10 'bench.kinds=[process_kill]' 'bench.modes=[live]'

Modes (``bench.modes``, see MODES): ``live_standby`` (live recovery with a warm standby group,
``ft.standby_groups=1``), ``live_fork`` (no standby: relaunches forked from a warm fork server,
``ft.warm_fork=true``), ``live`` (no standby, cold: fresh interpreters), ``full_restart``
(the baseline). A build whose config has no ``ft.standby_groups`` skips ``live_standby``
with a printed line and runs the rest. Kinds (``bench.kinds``): a fault kind, with its mode
after a colon (``hang:gil``, ``collective:hang``). Each (mode, kind) is one drill of
``bench.repeats`` faults in ``<run>/<n>-<mode>-<kind>/``; after each drill the aggregate
(``<run>/report.md``, ``mttr.png``, ``summary.json``: every mode side by side, MTTR p50/p95,
the survivors' longest stall, and each mode over full restart) is rewritten, so a sweep
stopped early still leaves its report. Under a Hydra multirun (``-m``) each job runs its own
sweep and the aggregate covers every drill under the sweep directory.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from chaos.config import ChaosConfig, DrillConfig, FaultConfig
from chaos.kinds import fault_kinds
from chaos.kinds.base import option_names
from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.records.errors import ConfigError

# A sweep mode: ft.recovery, the warm standby groups and ft.warm_fork it runs with.
MODES = {
    "live_standby": ("live", 1, True),
    # No standby: relaunches fork from a warm fork server (monarch_ft.controller.fork_pool) ...
    "live_fork": ("live", 0, True),
    # ... or start fresh interpreters (the cold path).
    "live": ("live", 0, False),
    "full_restart": ("full_restart", 0, False),
}


@dataclass
class BenchConfig:
    """The MTTR bench's sweep (``monarch-ft mttr-bench`` only): each (mode, kind) is one drill.

    The bench sets ``ft.recovery``, ``ft.standby_groups`` and ``ft.warm_fork`` per mode, and
    ``chaos.faults`` from ``kinds``: those keys, and the Poisson schedule's and ``chaos.baseline``
    (``full_restart`` is one of the modes), are refused on its command line.
    """

    modes: List[str] = field(default_factory=lambda: ["live_standby", "live", "full_restart"])
    """Recovery modes to sweep, in this order: ``live_standby`` (a warm standby group), ``live_fork``
    (relaunches forked from a warm fork server), ``live`` (cold: fresh interpreters), ``full_restart``
    (every group from disk: the baseline)."""

    kinds: List[str] = field(default_factory=lambda: ["process_kill", "node", "hang", "hang:gil", "collective:hang"])
    """Fault kinds, a mode after a colon: ``hang`` is a SIGSTOP hang, ``hang:gil`` a rank sleeping with the GIL held."""

    repeats: int = 2
    """Faults per (mode, kind) drill."""

    first_step: int = 10
    """The committed step the first fault of each drill fires at."""

    every_steps: int = 15
    """Steps between two faults of a drill (each fires only after the previous one recovered)."""

    collective_hang_s: float = 8.0
    """Seconds a kind with a duration lasts: how long ``collective:hang``'s rank stalls before the
    allreduce (above ``ft.timeout_s``), and how long a network fault (partition, slow_link) holds."""


@dataclass
class MTTRBenchConfig(DrillConfig):
    """The MTTR bench: a drill's job (every section of :class:`DrillConfig`) and the sweep."""

    bench: BenchConfig = field(default_factory=BenchConfig)
    """The sweep: modes x kinds, with repeats."""


# What the bench sets itself, per mode (MODES) or from bench.kinds: given on its command line,
# each would be overwritten without a word.
SET_BY_MODES = ("ft.recovery", "ft.standby_groups", "ft.warm_fork")
SET_FROM_KINDS = ("chaos.faults", "chaos.schedule", "chaos.rate_per_min", "chaos.count", "chaos.kinds", "chaos.baseline")


def bench_config_problem(job: MTTRBenchConfig, overrides: Iterable[str] = ()) -> Optional[str]:
    """One line naming the fix for a key the bench would ignore (it sets it itself), else None.

    Args:
        job: the bench's config.
        overrides: the command line's overrides (a key given there is refused even at its default value).
    """
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    defaults = MTTRBenchConfig()
    for key in (*SET_BY_MODES, *SET_FROM_KINDS):
        section, name = key.split(".")
        value = getattr(getattr(job, section), name)
        if key in given or value != getattr(getattr(defaults, section), name):
            if key in SET_BY_MODES:
                return f"{key} has no effect in the MTTR bench (each of bench.modes sets it: {', '.join(MODES)}): drop it and choose bench.modes"
            return f"{key} has no effect in the MTTR bench (its faults come from bench.kinds, bench.repeats, bench.first_step and bench.every_steps): drop it"
    return None


ConfigStore.instance().store(name="mttr_bench_schema", node=MTTRBenchConfig)


def parse_kind(text: str) -> tuple[str, Optional[str]]:
    """``hang:gil`` -> ("hang", "gil"); a kind without a colon has its default mode."""
    kind, _, mode = text.partition(":")
    kinds = fault_kinds()
    if kind not in kinds:
        raise ConfigError(f"bench.kinds: {text!r}: choose among {', '.join(kinds)} (a mode after a colon, e.g. hang:gil)")
    if mode and mode not in kinds[kind].modes:
        raise ConfigError(f"bench.kinds: {text!r}: {kind} has modes {', '.join(kinds[kind].modes) or '(none)'}")
    return kind, mode or None


def plan(job: MTTRBenchConfig, overrides: Iterable[str] = ()) -> tuple[list[tuple[str, str, MTTRBenchConfig]], list[str]]:
    """The sweep's drills (mode name, kind text, the drill's config) and the modes skipped, with why.

    ``overrides``: the command line's (see :func:`bench_config_problem`).

    Raises:
        ConfigError: an unknown mode or kind, or a drill its config refuses (before anything runs).
    """
    from chaos.config import validate_chaos
    from monarch_ft.controller.preflight import preflight

    b = job.bench
    problem = bench_config_problem(job, overrides)
    if problem:
        raise ConfigError(problem)
    if b.repeats < 1:
        raise ConfigError(f"bench.repeats={b.repeats}: must be >= 1")
    drills, skipped = [], []
    for mode in b.modes:
        if mode not in MODES:
            raise ConfigError(f"bench.modes: {mode!r}: choose among {', '.join(MODES)}")
        recovery, standby, warm_fork = MODES[mode]
        if standby and not hasattr(job.ft, "standby_groups"):
            skipped.append(f"{mode}: this build's config has no ft.standby_groups (warm standby groups are not merged yet)")
            continue
        for text in b.kinds:
            kind, fault_mode = parse_kind(text)
            cfg = copy.deepcopy(job)
            cfg.ft.recovery = recovery
            if hasattr(cfg.ft, "standby_groups"):
                cfg.ft.standby_groups = standby
            if hasattr(cfg.ft, "warm_fork"):
                cfg.ft.warm_fork = warm_fork
            # The kind's own options only: a mode where one was given, the stall where the kind has a duration.
            own = {fault_kinds()[kind].mode_option: fault_mode} if fault_mode else {}
            if "duration_s" in option_names(fault_kinds()[kind].options):
                own["duration_s"] = b.collective_hang_s
            faults = [FaultConfig(kind=kind, at_step=b.first_step + i * b.every_steps, **own) for i in range(b.repeats)]
            cfg.chaos = ChaosConfig(
                faults=faults,
                seed=job.chaos.seed,
                allow_last_healthy=job.chaos.allow_last_healthy,
                recovery_timeout_s=job.chaos.recovery_timeout_s,
                tail_steps=job.chaos.tail_steps,
            )
            preflight(cfg)
            validate_chaos(cfg, faults)
            drills.append((mode, text, cfg))
    return drills, skipped


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


@hydra_main("mttr_bench")
def main(cfg: DictConfig) -> None:
    from chaos.drill import drill_ok, run_drill
    from chaos.report import write_aggregate_report

    job: MTTRBenchConfig = OmegaConf.to_object(cfg)
    hc = HydraConfig.get()
    out = hc.runtime.output_dir
    multirun = hc.mode.name == "MULTIRUN"
    try:
        drills, skipped = plan(job, hc.overrides.task)
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)
    for line in skipped:
        print(f"[mttr_bench] skipping mode {line}", flush=True)
    report_dir = hc.sweep.dir if multirun else out
    print(
        f"[mttr_bench] {len(drills)} drills ({job.bench.repeats} faults each): modes {', '.join(sorted({m for m, _, _ in drills}, key=list(MODES).index))}; "
        f"kinds {', '.join(job.bench.kinds)}; report in {report_dir}",
        flush=True,
    )
    started, ok = time.time(), True
    for n, (mode, kind, cfg) in enumerate(drills, start=1):
        t0 = time.time()
        print(f"[mttr_bench] {n}/{len(drills)} {mode} {kind}: running", flush=True)
        drill_dir = os.path.join(out, f"{n:02d}-{mode}-{kind.replace(':', '-')}")
        drill = run_drill(cfg, drill_dir)
        ok = ok and drill_ok(drill)
        drill_paths = sorted(glob.glob(os.path.join(report_dir, "**", "drill.json"), recursive=True))
        paths = write_aggregate_report(report_dir, [json.load(open(p)) for p in drill_paths])
        mttrs = ", ".join(f"{f['mttr_s']}s" if f.get("injected", True) else f"not injected ({f['not_injected']['reason']})" for f in drill["faults"])
        elapsed = time.time() - started
        left = elapsed / n * (len(drills) - n)
        print(
            f"[mttr_bench] {n}/{len(drills)} {mode} {kind}: mttr {mttrs}; recovered {sum(bool(f.get('recovered')) for f in drill['faults'])}/"
            f"{len(drill['faults'])} in {_clock(time.time() - t0)} (elapsed {_clock(elapsed)}, about {_clock(left)} left)",
            flush=True,
        )
        if not drill_ok(drill):
            print(f"[mttr_bench] {mode} {kind}: a fault did not recover cleanly, see {drill_dir}/drill.json", file=sys.stderr, flush=True)
    if drills:
        print(f"[mttr_bench] aggregate over the sweep: {paths['report']}", flush=True)
    # In a multirun each job's code is kept and the next job runs (monarch_ft.cli.sweep).
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
