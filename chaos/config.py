"""Drill configs: the pretrain schema plus a ``chaos`` section (Hydra structured)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore

from monarch_ft.config import ConfigError, JobConfig

# Faults a restart answers (the group's processes are gone or killed) vs in-place ones.
RESTART_KINDS = ("process_kill", "segfault", "sigterm", "hang", "node")
# Network faults on a simulated host's link (launcher=local_hosts): in place (no process
# is touched), undone after duration_s; a partition longer than the supervisor's hang
# timeout may still end in a restart, so the restart budget counts it.
NETWORK_KINDS = ("partition", "slow_link")
# The job's control plane: SIGKILL the supervisor (the drill's watchdog attaches a new one
# after delay_s: chaos/watchdog.py) or the Lighthouse (the supervisor restarts it). No
# group is touched; the target is only the group whose commits show the recovery.
CONTROL_KINDS = ("controller", "lighthouse")
IN_PLACE_KINDS = ("collective",) + NETWORK_KINDS + CONTROL_KINDS
FAULT_KINDS = RESTART_KINDS + IN_PLACE_KINDS
# In-place kinds: the event after which a commit of the target group (in the quorum)
# counts as recovered: the rank acted on the fault / the link was restored / a new
# controller supervises / the Lighthouse is back on its address.
RECOVERY_MARKER = {
    "collective": "collective_fault_injected",
    "partition": "link_restored",
    "slow_link": "link_restored",
    "controller": "controller_attached",
    "lighthouse": "lighthouse_restarted",
}
# Kinds with a ``mode``: the choices, the first one the default.
#   hang: sigstop (the rank is SIGSTOPped: its OS state says so) | gil (the rank sleeps holding
#         the GIL: alive, its OS state like its peers', only its silence tells);
#   collective: abort (the rank's TorchFT process group aborted mid-step) | hang (the rank
#         stalls before the allreduce for duration_s, so the peers' collective times out).
FAULT_MODES = {"hang": ("sigstop", "gil"), "collective": ("abort", "hang")}


def fault_mode(f: "FaultConfig") -> Optional[str]:
    """The fault's mode, its kind's default when not given; None for kinds without modes."""
    modes = FAULT_MODES.get(f.kind)
    if modes is None:
        return None
    return f.mode or modes[0]


def fault_label(kind: str, mode: Optional[str]) -> str:
    """How reports name a fault kind: ``hang:gil``; a kind's default mode and kinds without
    modes by the kind alone (``hang`` is a SIGSTOP hang, as it always was)."""
    modes = FAULT_MODES.get(kind)
    return kind if not mode or not modes or mode == modes[0] else f"{kind}:{mode}"


@dataclass
class FaultConfig:
    kind: str = "process_kill"
    # When: at the first committed step >= at_step, or at_s seconds after training began.
    at_step: Optional[int] = None
    at_s: Optional[float] = None
    # Which replica group (None: drawn among healthy groups) and which rank in it.
    target: Optional[int] = None
    rank: int = 0
    # hang: sigstop (default) | gil; collective: abort (default) | hang, which lasts duration_s
    # (longer than ft.timeout_s). See FAULT_MODES. partition / slow_link: duration_s is how
    # long the link stays cut / slow.
    mode: Optional[str] = None
    duration_s: float = 15.0
    # slow_link: added latency (tc netem) and/or a rate limit ("1mbit"; netem or tbf).
    delay_ms: float = 0.0
    rate: Optional[str] = None
    # With warm standby groups (ft.standby_groups > 0): fire only once every standby is
    # ready, so the fault measures the standby path; false fires on schedule (e.g. a second
    # fault while the standby is still being rebuilt takes the cold path).
    wait_standby: bool = True
    # controller: seconds the job runs unsupervised before the watchdog attaches a new controller.
    delay_s: float = 5.0
    # controller: also SIGKILL rank ``rank`` of the target group while no controller is
    # attached (the watchdog does it halfway through delay_s); the new controller restarts it.
    kill_rank_unsupervised: bool = False


@dataclass
class ChaosConfig:
    faults: List[FaultConfig] = field(default_factory=list)
    # none: only ``faults``; poisson: ``count`` faults at rate_per_min, kinds from ``kinds``.
    schedule: str = "none"
    rate_per_min: float = 2.0
    count: int = 0
    kinds: List[str] = field(default_factory=lambda: ["process_kill"])
    seed: int = 0
    # Never hit the last healthy group unless this is set.
    allow_last_healthy: bool = False
    # Run the same faults again under ft.recovery=full_restart and compare.
    baseline: bool = False
    # A fault whose recovery has not finished after this long counts as not recovered.
    recovery_timeout_s: float = 120.0
    # After the last fault has recovered, train this many more steps, then finish.
    tail_steps: int = 10


@dataclass
class DrillConfig(JobConfig):
    chaos: ChaosConfig = field(default_factory=ChaosConfig)


def register_drill_configs() -> None:
    ConfigStore.instance().store(name="drill_schema", node=DrillConfig)


def validate_chaos(cfg: DrillConfig, faults: list[FaultConfig]) -> None:
    """Impossible drills fail here, before anything is launched."""
    ch, ft = cfg.chaos, cfg.ft
    if ch.schedule not in ("none", "poisson"):
        raise ConfigError(f"chaos.schedule={ch.schedule!r}: choose none or poisson")
    if ch.rate_per_min <= 0:
        raise ConfigError(f"chaos.rate_per_min={ch.rate_per_min}: must be > 0")
    if ch.count < 0:
        raise ConfigError(f"chaos.count={ch.count}: must be >= 0")
    if ch.schedule == "none" and ch.count:
        raise ConfigError("chaos.count is set but chaos.schedule=none: add chaos.schedule=poisson")
    if not faults:
        raise ConfigError("the drill has no faults: give chaos.faults=[{kind: process_kill, at_step: 10}] or chaos.schedule=poisson chaos.count=N")
    if ft.replica_groups < 2 and not ch.allow_last_healthy:
        raise ConfigError("a drill needs ft.replica_groups >= 2 (one group keeps training), or chaos.allow_last_healthy=true")
    for i, f in enumerate(faults):
        where = f"chaos.faults[{i}]"
        if f.kind not in FAULT_KINDS:
            raise ConfigError(f"{where}.kind={f.kind!r}: choose one of {', '.join(FAULT_KINDS)}")
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
        if f.mode is not None and f.kind in FAULT_MODES and f.mode not in FAULT_MODES[f.kind]:
            raise ConfigError(f"{where}.mode={f.mode!r}: {f.kind} faults are {' or '.join(FAULT_MODES[f.kind])}")
        if f.kind == "hang" and fault_mode(f) == "gil" and cfg.launcher.name == "monarch":
            raise ConfigError(
                f"{where}.mode=gil: a Monarch actor trains in a worker thread, where the rank cannot answer the gil hang's signal: "
                "use mode: sigstop, or another launcher"
            )
        if f.mode is not None and f.kind not in FAULT_MODES:
            raise ConfigError(f"{where}.mode={f.mode!r}: {f.kind} faults have no mode (only {', '.join(FAULT_MODES)} do): drop it")
        if f.kind in NETWORK_KINDS:
            _validate_network_fault(cfg, f, where)
        if f.kind in CONTROL_KINDS and cfg.ft.lighthouse_addr:
            raise ConfigError(f"{where}.kind={f.kind}: needs the Lighthouse the supervisor starts: unset ft.lighthouse_addr")
        if f.kind == "controller":
            if f.delay_s < 0:
                raise ConfigError(f"{where}.delay_s={f.delay_s}: must be >= 0 (seconds the job runs without a controller)")
            if f.delay_s >= cfg.controller.lease_s:
                raise ConfigError(
                    f"{where}.delay_s={f.delay_s} reaches controller.lease_s={cfg.controller.lease_s}: the ranks would end the job "
                    "before the new controller attaches; lower delay_s or raise controller.lease_s"
                )
            from monarch_ft.launcher import build_launcher

            problem = build_launcher(cfg.launcher, ".").adoption_problem() if cfg.launcher.name != "local" else None
            if problem:
                raise ConfigError(f"{where}.kind=controller: {problem}")
    budget_kinds = RESTART_KINDS + ("partition",)
    restarting = [f for f in faults if f.kind in budget_kinds]
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


def _validate_network_fault(cfg: DrillConfig, f: FaultConfig, where: str) -> None:
    from monarch_ft.launcher import launcher_options

    if cfg.launcher.name != "local" or not launcher_options(cfg.launcher).simulated_hosts:
        raise ConfigError(
            f"{where}.kind={f.kind}: network faults need simulated hosts (one network namespace per group): "
            "use launcher=local_hosts (launcher.options.simulated_hosts=true)"
        )
    if f.duration_s <= 0:
        raise ConfigError(f"{where}.duration_s={f.duration_s}: must be > 0 (how long the link stays {'cut' if f.kind == 'partition' else 'slow'})")
    if f.kind == "slow_link":
        if f.delay_ms < 0:
            raise ConfigError(f"{where}.delay_ms={f.delay_ms}: must be >= 0")
        if not f.delay_ms and not f.rate:
            raise ConfigError(f"{where}: a slow_link needs delay_ms > 0 and/or a rate (e.g. rate: 1mbit)")
        from monarch_ft.hosts import qdisc_supported

        if f.delay_ms and not qdisc_supported("netem"):
            raise ConfigError(
                f"{where}.delay_ms={f.delay_ms:g}: this kernel has no tc netem qdisc (CONFIG_NET_SCH_NETEM) to add latency: "
                "give only a rate (delay_ms: 0, rate: 1mbit; tbf), or run on a kernel with netem"
            )
        if f.rate and not f.delay_ms and not qdisc_supported("tbf"):
            raise ConfigError(f"{where}.rate={f.rate}: this kernel has no tc tbf qdisc (CONFIG_NET_SCH_TBF) to limit the rate")
