"""Structured (dataclass) configs for every monarch_ft launch.

The dataclasses are registered in Hydra's ConfigStore so that a misspelt key or a
wrong type in an override fails at once with Hydra's own message. Values the schema
cannot judge (zero groups, a port in use, ...) are checked by :func:`validate`, which
raises :class:`ConfigError` with one line that names the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from monarch_ft.records.errors import ConfigError


@dataclass
class ModelConfig:
    """A TorchTitan model: ``flavor`` names an entry of ``torchtitan.models.<name>``'s args."""

    name: str = "llama3"
    flavor: str = "debugmodel"
    # Optional overrides of the flavor's TransformerModelArgs.
    dim: Optional[int] = None
    n_layers: Optional[int] = None
    n_heads: Optional[int] = None
    vocab_size: int = 2048


@dataclass
class TrainingConfig:
    steps: int = 30
    batch_size: int = 2
    seq_len: int = 128
    lr: float = 8e-4
    warmup_steps: int = 2
    weight_decay: float = 0.1
    seed: int = 0
    # torch threads per rank; ranks share the machine's cores.
    threads_per_rank: int = 1
    # Report a state hash every N committed steps (0: only at the end); drills use it
    # to check that a rejoined group holds exactly the healthy groups' weights.
    state_hash_every: int = 0
    # auto: CUDA when torch sees a GPU, else CPU; cpu; cuda (refused where torch sees none).
    # See monarch_ft/common/devices.py for the GPU each rank takes.
    device: str = "auto"


@dataclass
class DataConfig:
    """What the ranks train on (monarch_ft/common/data.py); prepared once by the controller."""

    # Text shipped with every Python install: the standard library's own sources (used
    # when ``path`` is unset; also what the tokenizer is trained on).
    corpus: str = "stdlib"
    # A file of your own instead: text (.txt .md .rst .py; tokenised with the project's
    # tokenizer, cached) or token ids (.npy 1-D integers; .bin/.u16 raw little-endian
    # uint16; .u32 raw uint32), every id below model.vocab_size. Relative to the launch directory.
    path: Optional[str] = None
    max_corpus_mb: float = 4.0
    # Where the trained tokenizer and token file are cached; None: <repo>/.cache/monarch_ft.
    cache_dir: Optional[str] = None


@dataclass
class FTConfig:
    replica_groups: int = 2
    ranks_per_group: int = 2
    # Lighthouse: started by the supervisor unless ``lighthouse_addr`` names a running one.
    lighthouse_addr: Optional[str] = None
    lighthouse_host: str = "127.0.0.1"
    lighthouse_port: int = 0
    min_replica_size: int = 1
    # Lighthouse timing. The survivors of a fault stall for about heartbeat_timeout_ms.
    heartbeat_timeout_ms: int = 1000
    join_timeout_ms: int = 1000
    quorum_tick_ms: int = 50
    # Manager timing (collectives, should_commit, checkpoint transfers).
    timeout_s: float = 10.0
    quorum_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    # Checkpoint transport used to heal a restarted group from a live peer: sharded (ours,
    # monarch_ft.transport) | http (TorchFT's HTTPTransport).
    transport: str = "sharded"
    # The process group across groups (torchft): auto (NCCL on CUDA, gloo on CPU) | nccl | gloo
    # (gloo also carries CUDA tensors, through host memory).
    cross_group_backend: str = "auto"
    # Each group its own NCCL_HOSTID, so a cross-group NCCL communicator accepts two groups'
    # ranks on one GPU (NCCL then uses its socket transport between them). Needed when
    # groups share a GPU (more ranks than GPUs on the host); see monarch_ft/common/devices.py.
    nccl_hostid_per_group: bool = False
    # Where the sharded transport (not http) binds and what it advertises to the peers
    # that heal from this rank: an interface name (e.g. ib0: its address) or an address
    # of the rank's host. null: the interface of the RDMA port discovery found, else the
    # route to the Lighthouse (the local address the kernel uses to reach it). Each
    # rank logs its choice and why (event transport_interface).
    transport_interface: Optional[str] = None
    # Supervisor watch (monarch_ft/controller/hangs.py). A rank that reports nothing (its liveness
    # thread beats 4 times a second) or computes one step for longer than this is hung.
    # auto: learned as the job runs: max(hang_min_s, hang_step_factor x the p99 of the last
    # 200 steps' compute seconds (step time less quorum and cross-group sync), every rank's);
    # until 4 steps were seen, max(hang_min_s, 15 s). A number (seconds) fixes it. Waits in
    # TorchFT get TorchFT's own bound, saves checkpoint.save_timeout_s (see HangLimits).
    hang_timeout_s: str = "auto"
    # The floor of the learned hang timeout: a dozen missed liveness beats. On a loaded 2-core
    # machine a rank's step took 1.6 s where its p99 had been 0.2 s while a group restarted
    # next to it: 1.5 s was too tight.
    hang_min_s: float = 3.0
    # k of the learned hang timeout (k x p99 of the recent compute seconds per step): a step
    # may take 10 times its recent worst before it counts as stuck.
    hang_step_factor: float = 10.0
    # A rank stopped (SIGSTOP), a zombie, or in uninterruptible sleep (disk-sleep, outside
    # startup and saves) this long without a break is hung at once.
    os_stall_s: float = 0.5
    # A stepping rank whose process is asleep this long (its main thread sleeping at every
    # sample, next to no CPU: recovery.track_cpu) is hung, without waiting for the hang
    # timeout, when it is also silent while ranks elsewhere beat (a thread holds the GIL
    # while it waits: hang mode gil), or when it is in compute with its whole group asleep and
    # waiting for it (a collective it never joined; on a GPU at least 4 x the learned compute p99).
    # A busy rank on a loaded machine may miss beats for a second, but it uses CPU.
    asleep_s: float = 1.0
    # A freshly launched group must report its first step within this long.
    startup_timeout_s: float = 120.0
    # Every stepping group silent at once is one job-wide stall, not N faults: the
    # supervisor captures stacks and waits this long before resuming the whole job from
    # its newest checkpoint (it never kills every group holding the job's state one by one).
    stall_timeout_s: float = 60.0
    # The restart budget, a rate: a group relaunched max_restarts times within the last
    # restart_window_s seconds is given up at its next failure (recovery.recent_restarts).
    max_restarts: int = 3
    # One hour. Over a job's whole life instead, a multi-day run would give up on a group at
    # its fourth ordinary fault, even days apart (a large job sees a fault every few hours:
    # 419 interruptions in 54 days on Llama 3's 16k GPUs; any one group far fewer). A group
    # that keeps failing fails again within minutes of each relaunch (a relaunch takes tens of
    # seconds here, the backoff at most restart_backoff_max_s), so it spends max_restarts
    # inside the hour and is given up at its fourth failure; one failing the same way at
    # start-up is given up at its second (a crash loop, recovery.crash_loop), whatever the
    # budget. A group failing fewer than max_restarts times an hour is kept: down a minute or
    # two each time, it still trains most of the hour.
    restart_window_s: float = 3600.0
    # live: restart only the failed group, which heals from a peer (TorchFT).
    # full_restart: stop every group and resume all from the last disk checkpoint
    # (what plain torchrun/TorchElastic does): the baseline drills compare against.
    recovery: str = "live"
    # Warm standby groups (monarch_ft/controller/standby_pool.py): groups of ranks_per_group ranks, built
    # (model sharded, optimizer state, data, transport) and waiting without joining the
    # quorum, one of which takes a failed group's place instead of a cold restart. None:
    # the launcher's default (LauncherTraits.default_standby_groups): 1 with launcher=local
    # and local_hosts, 0 with slurm/monarch (where a standby holds a real allocation, its
    # own Slurm job or proc mesh, so K > 0 is the user's choice).
    # ft.recovery=full_restart uses none.
    standby_groups: Optional[int] = None
    # A relaunch with no standby ready forks its ranks from a fork server that imported
    # torch/TorchTitan/TorchFT at launch (monarch_ft/controller/fork_pool.py: recovery path warm_fork)
    # instead of fresh interpreters (cold_start). launcher=local/local_hosts only (others
    # start cold and say so); ft.recovery=full_restart never uses it. false: always cold.
    warm_fork: bool = True
    restart_backoff_s: float = 0.5
    restart_backoff_max_s: float = 8.0
    # How groups synchronise (monarch_ft/rank/components/sync.py):
    # hsdp: every step, the local grad shards averaged across groups (one flat allreduce);
    # localsgd: each group steps alone, the parameters averaged every ``sync_every`` steps
    # (torchft.local_sgd.LocalSGD); diloco: each group steps alone, every ``sync_every`` steps
    # the pseudo-gradients (last global copy - local weights) are averaged and applied by an
    # outer optimizer (torchft.local_sgd.DiLoCo; streaming DiLoCo with ``fragments`` > 1).
    mode: str = "hsdp"
    # Inner steps between two syncs (localsgd, diloco): H. training.steps must be a multiple.
    sync_every: int = 20
    # DiLoCo's outer optimizer: SGD with Nesterov momentum, as in the DiLoCo paper.
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_nesterov: bool = True
    # Streaming DiLoCo: the model split into this many fragments, one synced every
    # sync_every / fragments steps (1: plain DiLoCo). sync_every must be a multiple.
    fragments: int = 1


@dataclass
class CheckpointConfig:
    """Periodic disk checkpoints through TorchTitan's CheckpointManager (DCP)."""

    enable: bool = True
    interval: int = 10
    # Relative to the run directory; each group writes under <folder>/group_<g>.
    folder: str = "checkpoint"
    keep_latest_k: int = 2
    # Resume every group from its latest disk checkpoint at launch.
    resume: bool = False
    # A save that takes longer is stuck: the rank dumps its stacks, reports
    # checkpoint_save_timeout and exits. While a rank is saving, the supervisor's hang
    # detector allows it this long (not ft.hang_timeout_s).
    save_timeout_s: float = 120.0


@dataclass
class MetricsConfig:
    """What the ranks record besides their report files (which the supervisor always reads)."""

    # TensorBoard event files, one run per replica group (<run>/tensorboard/group_<g>, written by
    # the group's rank 0): loss, lr, tokens/s, step time, quorum size, and a marker at every
    # restart, heal, disk load, quorum change, failed commit and fault
    # (monarch_ft/rank/components/tensorboard.py). View: tensorboard --logdir <run>/tensorboard
    tensorboard: bool = False
    # Seconds between flushes of the event files: the curve a killed rank can lose (markers are flushed at once).
    tensorboard_flush_s: float = 1.0


@dataclass
class ControllerConfig:
    """The controller (supervisor) and the job are separate lives (monarch_ft/controller/takeover.py).

    The ranks and the Lighthouse no longer die with the supervisor: a supervisor that is
    killed, or detached (SIGUSR2), leaves the job training, and a new one takes it over.
    """

    # Take over the job already running in hydra.run.dir (its ranks, Lighthouse, report
    # offsets and counters, from controller.json) instead of starting a new one. The saved
    # job config wins over the command line's, except for this section.
    attach: bool = False
    # Ranks that have not seen a controller's heartbeat for this long end the job by
    # themselves: finished groups stop holding it open, the others finish at a common
    # step, save a checkpoint there and exit 0 (and the Lighthouse follows). 600 s: long
    # enough for a laptop lid or a controller restart, short enough that an abandoned job
    # does not hold its machines for long.
    lease_s: float = 600.0
    # How often the controller refreshes its heartbeat (control/controller) for the lease.
    heartbeat_s: float = 1.0


@dataclass
class LauncherConfig:
    """How ranks become processes: ``local`` (embedded default) or an engine (``monarch``, ``slurm``).

    ``name`` selects the module ``monarch_ft.launcher.<name>``; ``options`` are that
    launcher's own settings, its ``Options`` dataclass (a typed node once ``launcher=<name>``
    is selected: see :func:`register_configs`; a plain dict when built in code).
    """

    name: str = "local"
    # Upper bound on ranks per CPU core the local machine is asked to run.
    max_ranks_per_core: int = 4
    options: Any = field(default_factory=dict)


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    ft: FTConfig = field(default_factory=FTConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)


TRANSPORTS = ("sharded", "http")
RECOVERY_MODES = ("live", "full_restart")
SYNC_MODES = ("hsdp", "localsgd", "diloco")


def register_configs() -> None:
    """Register the schemas so YAML files under configs/ are validated against them."""
    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=JobConfig)
    cs.store(group="model", name="schema", node=ModelConfig)
    cs.store(group="ft", name="schema", node=FTConfig)
    # One schema per launcher (launcher/<name>_schema): its options typed by the launcher's own dataclass.
    from monarch_ft.launcher import options_types

    for name, options in options_types().items():
        cs.store(group="launcher", name=f"{name}_schema", node=LauncherConfig(name=name, options=options()))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_transport_interface(cfg: JobConfig) -> None:
    """``ft.transport_interface`` must name an interface (or address) of the hosts the
    ranks run on.  Checked here where those interfaces are known before launch: this
    host's for ranks on this machine; a simulated host's are ``eth0`` and ``lo``, and
    each has its own address.  Ranks on other machines (slurm) check it at start."""
    value = cfg.ft.transport_interface
    if not value:
        return
    from monarch_ft.transport.interface import InterfaceError, choose, local_interfaces

    fix = "name one of them, an address one holds, or null for the default (the RDMA port's interface, else the route to the Lighthouse)"
    from monarch_ft.launcher import launcher_traits

    traits = launcher_traits(cfg.launcher)
    if traits.simulated_hosts:
        from monarch_ft.launcher.hosts import Host

        names = sorted({"lo", Host.ifname})
        _require(
            value in names,
            f"ft.transport_interface={value!r}: a simulated host has the interfaces {', '.join(names)}, each host its own "
            "address: name one of them, or null for the default (the route to the Lighthouse)",
        )
        return
    if not traits.ranks_on_this_machine:
        return
    try:
        choose(value, local_interfaces())
    except InterfaceError as e:
        raise ConfigError(f"ft.transport_interface={value!r}: {e}: {fix}") from None


def validate(cfg: JobConfig) -> None:
    """Reject what the schema can't: each failure is one line naming the fix."""
    ft, tr = cfg.ft, cfg.training
    _require(ft.replica_groups >= 1, f"ft.replica_groups={ft.replica_groups}: need at least 1 replica group")
    _require(ft.ranks_per_group >= 1, f"ft.ranks_per_group={ft.ranks_per_group}: need at least 1 rank per group")
    _require(
        1 <= ft.min_replica_size <= ft.replica_groups,
        f"ft.min_replica_size={ft.min_replica_size}: must be between 1 and ft.replica_groups={ft.replica_groups}",
    )
    _require(tr.steps >= 1, f"training.steps={tr.steps}: must be >= 1")
    _require(tr.batch_size >= 1, f"training.batch_size={tr.batch_size}: must be >= 1")
    _require(tr.seq_len >= 8, f"training.seq_len={tr.seq_len}: must be >= 8")
    _require(tr.lr > 0, f"training.lr={tr.lr}: must be > 0")
    _require(cfg.metrics.tensorboard_flush_s > 0, f"metrics.tensorboard_flush_s={cfg.metrics.tensorboard_flush_s}: must be > 0")
    _require(tr.threads_per_rank >= 1, f"training.threads_per_rank={tr.threads_per_rank}: must be >= 1")
    _require(
        ft.transport != "pg",
        "ft.transport=pg: TorchFT's PGTransport over the Manager's gloo group times out on receive with torchft 0.2.0; use sharded or http",
    )
    _require(ft.transport in TRANSPORTS, f"ft.transport={ft.transport!r}: choose one of {', '.join(TRANSPORTS)}")
    from monarch_ft.launcher import available_launchers

    _require(
        cfg.launcher.name in available_launchers(),
        f"launcher={cfg.launcher.name!r}: choose one of {', '.join(available_launchers())}",
    )
    from monarch_ft.launcher import launcher_options

    launcher_options(cfg.launcher)
    _check_transport_interface(cfg)
    from monarch_ft.common.model_catalog import model_problem

    problem = model_problem(cfg.model.name, cfg.model.flavor)
    _require(problem is None, problem or "")
    from monarch_ft.common.devices import CROSS_GROUP_BACKENDS, DEVICES

    _require(tr.device in DEVICES, f"training.device={tr.device!r}: choose one of {', '.join(DEVICES)}")
    _require(
        ft.cross_group_backend in CROSS_GROUP_BACKENDS,
        f"ft.cross_group_backend={ft.cross_group_backend!r}: choose one of {', '.join(CROSS_GROUP_BACKENDS)}",
    )
    _require(ft.recovery in RECOVERY_MODES, f"ft.recovery={ft.recovery!r}: choose one of {', '.join(RECOVERY_MODES)}")
    _require(ft.mode in SYNC_MODES, f"ft.mode={ft.mode!r}: choose one of {', '.join(SYNC_MODES)}")
    if ft.mode != "hsdp":
        _require(ft.sync_every >= 1, f"ft.sync_every={ft.sync_every}: must be >= 1")
        _require(
            ft.fragments == 1 or ft.mode == "diloco",
            f"ft.fragments={ft.fragments}: fragments (streaming DiLoCo) need ft.mode=diloco",
        )
        _require(
            ft.fragments >= 1 and ft.sync_every % ft.fragments == 0,
            f"ft.fragments={ft.fragments}: must be >= 1 and divide ft.sync_every={ft.sync_every}",
        )
        window = ft.sync_every // ft.fragments
        _require(
            tr.steps % window == 0,
            f"training.steps={tr.steps}: ft.mode={ft.mode} syncs every {window} steps; use a multiple of {window} "
            "(steps after the last sync would never be averaged)",
        )
        _require(ft.outer_lr > 0, f"ft.outer_lr={ft.outer_lr}: must be > 0")
        _require(0 <= ft.outer_momentum < 1, f"ft.outer_momentum={ft.outer_momentum}: must be in [0, 1)")
    from monarch_ft.controller.standby_pool import check_standby_config

    check_standby_config(cfg)
    _require(ft.max_restarts >= 0, f"ft.max_restarts={ft.max_restarts}: must be >= 0")
    _require(
        ft.restart_window_s > 0,
        f"ft.restart_window_s={ft.restart_window_s}: must be > 0 (the seconds within which at most ft.max_restarts relaunches of a group are allowed)",
    )
    from monarch_ft.controller.hangs import hang_timeout_setting

    try:
        hang_timeout = hang_timeout_setting(ft.hang_timeout_s)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _require(
        hang_timeout is None or hang_timeout > ft.timeout_s,
        f"ft.hang_timeout_s={ft.hang_timeout_s} must exceed ft.timeout_s={ft.timeout_s}: a rank blocked in a collective "
        "until its timeout would be taken for hung; raise ft.hang_timeout_s (or use auto)",
    )
    _require(ft.hang_min_s > 0, f"ft.hang_min_s={ft.hang_min_s}: must be > 0")
    _require(ft.hang_step_factor >= 1, f"ft.hang_step_factor={ft.hang_step_factor}: must be >= 1 (a multiple of the p99 step time)")
    _require(ft.os_stall_s > 0, f"ft.os_stall_s={ft.os_stall_s}: must be > 0")
    _require(ft.asleep_s > 0, f"ft.asleep_s={ft.asleep_s}: must be > 0")
    _require(
        0 <= ft.lighthouse_port <= 65535,
        f"ft.lighthouse_port={ft.lighthouse_port}: must be 0 (a free port) or 1-65535",
    )
    _require(cfg.checkpoint.interval >= 1, f"checkpoint.interval={cfg.checkpoint.interval}: must be >= 1")
    _require(cfg.checkpoint.save_timeout_s > 0, f"checkpoint.save_timeout_s={cfg.checkpoint.save_timeout_s}: must be > 0")
    _require(ft.stall_timeout_s >= 0, f"ft.stall_timeout_s={ft.stall_timeout_s}: must be >= 0")
    _require(
        cfg.checkpoint.keep_latest_k == 0 or cfg.checkpoint.keep_latest_k >= 2,
        f"checkpoint.keep_latest_k={cfg.checkpoint.keep_latest_k}: use 0 (keep all) or >= 2",
    )
    ctl = cfg.controller
    _require(
        ctl.heartbeat_s > 0 and ctl.lease_s > 2 * ctl.heartbeat_s,
        f"controller.lease_s={ctl.lease_s} must exceed twice controller.heartbeat_s={ctl.heartbeat_s} (and both be > 0)",
    )
    total = ft.replica_groups * ft.ranks_per_group
    from monarch_ft.launcher import launcher_traits

    if launcher_traits(cfg.launcher).ranks_on_this_machine:
        from monarch_ft.common.devices import device_problem

        problem = device_problem(tr.device, ft.cross_group_backend, ft.nccl_hostid_per_group, ft.replica_groups, ft.ranks_per_group)
        _require(problem is None, problem or "")
        cores = os.cpu_count() or 1
        limit = max(4, cores * cfg.launcher.max_ranks_per_core)
        _require(
            total <= limit,
            f"{total} ranks ({ft.replica_groups} groups x {ft.ranks_per_group}) exceed what this machine can run "
            f"({limit} = {cores} cores x launcher.max_ranks_per_core): lower ft.replica_groups or ft.ranks_per_group",
        )
