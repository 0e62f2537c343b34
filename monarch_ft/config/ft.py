"""``ft``: the fault tolerance: replica groups, the Lighthouse, TorchFT's timeouts, the hang
model, the restart budget, warm standbys and forks, and how groups synchronise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from monarch_ft.common.devices import CROSS_GROUP_BACKENDS
from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import ConfigError, require
from monarch_ft.records.global_batch import SETTINGS as GLOBAL_BATCH_SETTINGS

TRANSPORTS = ("sharded", "http")
RECOVERY_MODES = ("live", "full_restart")
SYNC_MODES = ("hsdp", "localsgd", "diloco")
STRAGGLER_POLICIES = ("off", "report", "evict")


# Every replica (each group's Manager, standbys too) heartbeats the Lighthouse, which spends
# about 60 us of CPU on each (benchmarks/lighthouse_scale.py: 58-88 us from 16 to 1,024
# replicas, docs/results/lighthouse-scale/): at 50 ms, 512 replicas took 59% of a core and 1,024
# could not all be heard (568 of 1,024 missing from a quorum on 2 cores). Half a millisecond
# of interval per replica holds the load at about 2,000 heartbeats a second (12% of a core).
HEARTBEAT_MIN_INTERVAL_MS = 50
HEARTBEAT_MS_PER_REPLICA = 0.5


def heartbeat_for(replicas: int) -> tuple[int, int]:
    """The default heartbeat interval and timeout (ms) for a job of ``replicas`` replicas
    (groups and standbys): 50 and 200 up to 100 replicas, then ``HEARTBEAT_MS_PER_REPLICA`` per
    replica, the timeout 4 x the interval. A dead group then leaves a quorum later at scale
    (about 2.5 s at 1,024): the price of a Lighthouse that hears every live one.

    Args:
        replicas: the replicas that heartbeat the one Lighthouse.
    """
    interval = max(HEARTBEAT_MIN_INTERVAL_MS, math.ceil(replicas * HEARTBEAT_MS_PER_REPLICA))
    return interval, 4 * interval


@dataclass
class FTConfig:
    """The fault tolerance: replica groups and TorchFT's Lighthouse and Manager, the controller's
    hang model and restart budget, warm standbys and forks, and how the groups synchronise."""

    replica_groups: int = 2
    """TorchFT replica groups: each holds a whole copy of the model and trains on its own data; a
    failed group is relaunched while the others keep training."""

    ranks_per_group: int = 2
    """Ranks (processes) in each group, which shard the model among them (FSDP)."""

    lighthouse_addr: Optional[str] = None
    """A running Lighthouse to use (``host:port`` or ``http://host:port``); null: the controller
    starts one. With an address set, the keys that configure the Lighthouse the controller starts
    (``lighthouse_host``, ``lighthouse_port``, ``heartbeat_timeout_ms``, ``join_timeout_ms``,
    ``quorum_tick_ms``) are refused: that one has its own."""

    lighthouse_host: str = "127.0.0.1"
    """Where the Lighthouse the controller starts listens. The default, 127.0.0.1, stands for the
    launcher's control host: the address its ranks reach this machine by (127.0.0.1 for local ranks)."""

    lighthouse_port: int = 0
    """Its port; 0: a free one."""

    min_replica_size: int = 1
    """Groups a quorum needs before it may commit a step (the Lighthouse's ``--min_replicas`` and
    the Manager's ``min_replica_size``). 1: a single surviving group keeps training."""

    heartbeat_timeout_ms: int = 0
    """Milliseconds without a heartbeat after which the Lighthouse takes a group for dead: about
    how long the survivors of a fault stall before a quorum without it (torchft 0.2.0's Lighthouse
    has no call that drops a replica sooner: docs/design/eviction.md). TorchFT's default is 5000;
    200 with ``heartbeat_interval_ms``=50 cut the survivors' stall from 1.1 s to about 0.3 s with
    no live group evicted under three CPU hogs on 2 cores (docs/results/eviction.md).
    0: by the job's size (:func:`heartbeat_for`: 200 up to 100 groups, 4 x the interval above;
    at least 4 x a ``heartbeat_interval_ms`` given)."""

    heartbeat_interval_ms: int = 0
    """Milliseconds between two heartbeats of a group's Manager to the Lighthouse (TorchFT's
    ``Manager(heartbeat_interval=...)``; its default is 100). ``heartbeat_timeout_ms`` must span at
    least 4 of them, so that a few late heartbeats on a loaded host do not evict a live group.
    0: by the job's size (:func:`heartbeat_for`: 50 up to 100 groups, then half a millisecond
    per group, so that the Lighthouse's heartbeat load stays the same)."""

    join_timeout_ms: int = 1000
    """Milliseconds the Lighthouse waits for heartbeating stragglers to join before issuing a quorum."""

    quorum_tick_ms: int = 50
    """Milliseconds between two checks of the Lighthouse for a quorum while it waits for stragglers."""

    timeout_s: float = 10.0
    """The Manager's timeout, in seconds, for collectives, ``should_commit`` and checkpoint transfers:
    the longest a survivor waits in an allreduce whose peer died (with ``close_failed_collective``
    a death reaches every survivor within milliseconds)."""

    close_failed_collective: bool = False
    """Close a rank's cross-group process group as soon as its step fails, not at the next quorum
    as torchft does. In gloo's ring only a dead group's two neighbours see its sockets close; the
    other survivors learn of it when a neighbour's sockets close too, so with this on a death goes
    round the ring in milliseconds, and with it off they wait out ``timeout_s``
    (monarch_ft.rank.components.ft.close_failed_process_group; at 8 groups the survivors' stall
    went 3.4 -> 0.6 s). Off by default for now: it moves when a failing group's step record lands,
    and in the corrupt-replica job test a group blamed and killed just after it asked for the next
    quorum then made a survivor wait 15 s in that quorum's process-group set-up (docs/design/eviction.md)."""

    quorum_timeout_s: float = 30.0
    """Seconds the Manager waits for a quorum (retried across Lighthouse restarts within it)."""

    @property
    def vote_timeout_s(self) -> float:
        """Seconds a rank waits in ``should_commit`` for the other ranks of its group to vote:
        2 x ``timeout_s``. A peer rank may still be in the step's collective, bounded by
        ``timeout_s`` from when it started it, and it may have started it later than this rank
        (a slower backward): with one timeout for both, a rank whose collective failed at once
        (its peer group's rank died) timed out of the vote just before its group peer, whose
        collective partner was alive but stuck, reached it; the rank raised, exited 1, and took
        its group, the job's only holder, with it (a Monarch job test beside two CPU hogs).
        Twice the timeout covers a peer that started up to a whole timeout later."""
        return 2 * self.timeout_s

    @property
    def sync_budget_s(self) -> float:
        """The longest a rank's TorchFT sync (quorum, collective, vote) lasts by TorchFT's own
        bounds: ``quorum_timeout_s`` + ``timeout_s`` + :attr:`vote_timeout_s`; the hang model
        gives a rank in that phase this much more than its silence limit
        (monarch_ft.controller.hangs.HangLimits)."""
        return self.quorum_timeout_s + self.timeout_s + self.vote_timeout_s

    connect_timeout_s: float = 10.0
    """Seconds the Manager waits to connect to the Lighthouse and its peers."""

    transport: str = "sharded"
    """How a restarted group heals from a live peer: ``sharded`` (ours, monarch_ft.transport: each
    rank sends its own shard) or ``http`` (TorchFT's HTTPTransport)."""

    cross_group_backend: str = "auto"
    """The process group across groups (TorchFT's): ``auto`` (NCCL on CUDA, gloo on CPU),
    ``nccl`` or ``gloo`` (gloo also carries CUDA tensors, through host memory)."""

    nccl_hostid_per_group: bool = False
    """Give each group its own ``NCCL_HOSTID``, so a cross-group NCCL communicator accepts two
    groups' ranks on one GPU (NCCL then uses its socket transport between them). Needed when
    groups share a GPU (more ranks than GPUs on the host); see monarch_ft/common/devices.py.
    Refused where it would do nothing: ``training.device=cpu`` or ``cross_group_backend=gloo``."""

    transport_interface: Optional[str] = None
    """Where the sharded transport binds and what it advertises to the peers that heal from this
    rank: an interface name (e.g. ib0: its address) or an address of the rank's host. null: the
    interface of the RDMA port discovery found, else the route to the Lighthouse (the local address
    the kernel uses to reach it). Each rank logs its choice and why (event ``transport_interface``).
    Refused with ``transport=http``, which binds TorchFT's own way."""

    hang_timeout_s: str = "auto"
    """Seconds after which a rank that reports nothing (its liveness thread beats 4 times a second),
    or computes one step for longer, is hung (monarch_ft/controller/hangs.py). ``auto``: learned as
    the job runs, max(``hang_min_s``, ``hang_step_factor`` x the p99 of the last 200 steps' compute
    seconds (step time less quorum and cross-group sync), every rank's); until 4 steps were seen,
    max(``hang_min_s``, 15 s). A number fixes it. Waits in TorchFT get TorchFT's own bound, saves
    ``checkpoint.save_timeout_s`` (see HangLimits)."""

    hang_min_s: float = 3.0
    """The floor, in seconds, of the learned hang timeout: a dozen missed liveness beats. On a
    loaded 2-core machine a rank's step took 1.6 s where its p99 had been 0.2 s while a group
    restarted next to it: 1.5 s was too tight."""

    hang_step_factor: float = 10.0
    """k of the learned hang timeout (k x the p99 of the recent compute seconds per step): a step may
    take 10 times its recent worst before it counts as stuck."""

    os_stall_s: float = 0.5
    """Seconds a rank may stay stopped (SIGSTOP), a zombie, or in uninterruptible sleep (disk-sleep,
    outside startup and saves) without a break before it is hung, at once."""

    asleep_s: float = 1.0
    """Seconds a stepping rank's process may be asleep (its main thread sleeping at every sample,
    next to no CPU: controller.hangs.track_cpu) before it is hung, without waiting for the hang
    timeout, when it is also silent while ranks elsewhere beat (a thread holds the GIL while it
    waits: hang mode gil), or when it is in compute with its whole group asleep and waiting for it
    (a collective it never joined; on a GPU at least 4 x the learned compute p99). A busy rank on a
    loaded machine may miss beats for a second, but it uses CPU."""

    startup_timeout_s: float = 120.0
    """Seconds a freshly launched group has to report its first step before it counts as failed."""

    stall_timeout_s: float = 60.0
    """Seconds the controller waits when every stepping group is silent at once (one job-wide
    stall, not N faults): it captures stacks, then resumes the whole job from its newest
    checkpoint (it never kills every group holding the job's state one by one)."""

    max_restarts: int = 3
    """The restart budget, a rate: a group relaunched this many times within the last
    ``restart_window_s`` seconds is given up at its next failure (controller.budget.recent_restarts)."""

    restart_window_s: float = 3600.0
    """Seconds of the restart budget's window. One hour: over a job's whole life instead, a
    multi-day run would give up on a group at its fourth ordinary fault, even days apart (a large
    job sees a fault every few hours: 419 interruptions in 54 days on Llama 3's 16k GPUs; any one
    group far fewer). A group that keeps failing fails again within minutes of each relaunch (a
    relaunch takes tens of seconds here, the backoff at most ``restart_backoff_max_s``), so it
    spends ``max_restarts`` inside the hour and is given up at its fourth failure; one failing the
    same way at start-up is given up at its second (a crash loop, controller.budget.crash_loop),
    whatever the budget. A group failing fewer than ``max_restarts`` times an hour is kept: down a
    minute or two each time, it still trains most of the hour."""

    recovery: str = "live"
    """``live``: restart only the failed group, which heals from a peer (TorchFT). ``full_restart``:
    stop every group and resume all from the last disk checkpoint (what plain torchrun/TorchElastic
    does): the baseline drills compare against; it uses no warm standby and no warm fork."""

    standby_groups: Optional[int] = None
    """Warm standby groups (monarch_ft/controller/standby_pool.py): groups of ``ranks_per_group``
    ranks, built (model sharded, optimizer state, data, transport) and waiting without joining the
    quorum, one of which takes a failed group's place instead of a cold restart. null: the
    launcher's default (LauncherTraits.default_standby_groups): 1 with launcher=local and
    local_hosts, 0 with slurm/monarch (where a standby holds a real allocation, its own Slurm job
    or proc mesh, so K > 0 is the user's choice). 0 turns them off; more than 0 is refused with
    ``recovery=full_restart``, which uses none."""

    warm_fork: bool = True
    """A relaunch with no standby ready forks its ranks from a fork server that imported
    torch/TorchTitan/TorchFT at launch (monarch_ft/controller/fork_pool.py: recovery path
    ``warm_fork``) instead of fresh interpreters (``cold_start``); so does every group's first
    launch, which waits for its host's server (at most 60 s) so the host imports once, not once
    per rank (``group_launched`` ``forked``). launcher=local/local_hosts only (others start cold
    and say so); ``recovery=full_restart`` never uses it. false: always cold."""

    restart_backoff_s: float = 0.5
    """Seconds before a failed group's first relaunch, doubled at each further relaunch within
    ``restart_window_s``: a group that fails at once on every launch neither spins nor waits long
    after a one-off fault."""

    restart_backoff_max_s: float = 8.0
    """The most seconds the doubling backoff waits before a relaunch."""

    node_probation_s: float = 600.0
    """A node a group's failure implicated (every rank on it lost at once: monarch_ft/controller/placement.py)
    is kept out of new allocations until the scheduler has counted it failed and then up again;
    one the scheduler counts up all along returns after this many seconds (the suspicion was
    wrong). Longer than the scheduler's own detection (Slurm's SlurmdTimeout, 300 s by default),
    so that a dead node is not handed out again before the scheduler knows. Only launchers with
    nodes (slurm) exclude any."""

    mode: str = "hsdp"
    """How groups synchronise (monarch_ft/rank/components/sync.py). ``hsdp``: every step, the local
    grad shards averaged across groups (one flat allreduce). ``localsgd``: each group steps alone,
    the parameters averaged every ``sync_every`` steps (torchft.local_sgd.LocalSGD). ``diloco``:
    each group steps alone; every ``sync_every`` steps the pseudo-gradients (last global copy -
    local weights) are averaged and applied by an outer optimizer (torchft.local_sgd.DiLoCo;
    streaming DiLoCo with ``fragments`` > 1)."""

    global_batch: str = "auto"
    """What a step trains while fewer groups than ``replica_groups`` take part in it (one is down,
    or healing). ``constant``: the groups taking part also train the absent groups' share of the
    step's data, by gradient accumulation, so every committed step trains the fault-free run's
    samples and tokens, each sample once (monarch_ft/records/global_batch.py); a survivor of G' of
    G groups then computes about G/G' times as long per step. ``shrink``: each group trains its own
    share only, and the step averages fewer groups' data (TorchFT's behaviour). ``auto``: constant
    with ``mode=hsdp``, shrink with localsgd and diloco, where constant is refused: their quorum
    runs at the end of a window, so nobody knows at its start which groups' data to take, and the
    window a group fails in cannot be redone exactly (TorchFT's LocalSGD keeps a failed sync's local
    weights, its DiLoCo its inner optimizer state)."""

    sync_every: int = 20
    """Inner steps between two syncs (localsgd, diloco): H. ``training.steps`` must be a multiple.
    Unused with ``mode=hsdp`` (which syncs every step) but not refused there, so that one sweep
    across modes (``-m ft.mode=hsdp,diloco ft.sync_every=10``) can set it for all."""

    outer_lr: float = 0.7
    """DiLoCo's outer optimizer's learning rate (SGD with Nesterov momentum, as in the DiLoCo paper).
    Unused with another mode, but not refused there (a sweep across modes sets it for all)."""

    outer_momentum: float = 0.9
    """DiLoCo's outer optimizer's momentum, in [0, 1) (the DiLoCo paper's). Unused with another mode."""

    outer_nesterov: bool = True
    """Nesterov momentum for DiLoCo's outer optimizer (with ``outer_momentum`` > 0). Unused with another mode."""

    fragments: int = 1
    """Streaming DiLoCo: the model split into this many fragments, one synced every
    ``sync_every`` / ``fragments`` steps (1: plain DiLoCo). ``sync_every`` must be a multiple.
    Refused with a mode other than ``diloco``."""

    integrity_every: str = "auto"
    """Steps between fingerprints of each rank's model and optimizer state, which the controller
    compares across the groups of one quorum: a minority that disagrees with the majority is
    failed and heals from it; two groups that disagree roll the job back to a verified
    checkpoint. A number fixes it (0: no fingerprints); auto: every step until the controller
    has timed 20 of them, then the smallest power of two at which they cost at most
    ft.integrity_budget of a step (an event says which and why). Powers of two, so groups that
    learned the choice a step apart still share every step one of them fingerprints."""

    integrity_budget: float = 0.01
    """The share of a step's time that ft.integrity_every=auto may spend on fingerprints."""

    grad_check: bool = True
    """ft.mode=hsdp: each rank checks its own gradient norm before the cross-group average; a
    non-finite norm, or one above ft.grad_outlier_factor x the median of its recent commits,
    votes against the commit (TorchFT's report_error) and every group discards the step, so one
    corrupt replica's gradient never reaches the others' weights."""

    grad_outlier_factor: float = 10.0
    """How many times the median of the recent gradient norms a norm may be before it is an outlier."""

    grad_history: int = 50
    """Committed steps whose gradient norms the outlier check remembers (it judges by norm only
    once it has 10 of them; a non-finite norm always)."""

    suspect_vetoes: int = 3
    """A group that votes against this many commits in a row while its state agrees with its
    peers' (its compute, not its memory, is bad) is failed as suspect and relaunched."""
    straggler: str = "report"
    """Fail-slow groups (monarch_ft/controller/stragglers.py): a group whose compute seconds per step
    exceed ``straggler_factor`` x its peers' median over ``straggler_window`` steps is a CPU
    straggler; one whose link, timed by a probe (a fixed payload each way, when the job's
    collective time rises while its compute does not, and every ``link_probe_s``), is slower than
    ``straggler_factor`` x its peers' median is a link straggler. Every group waits for either at
    each allreduce. ``report``: the event ``straggler_detected`` names it (``status``, the drill
    report, TensorBoard) and nothing else happens. ``evict``: also fail it and promote a ready
    standby (on another host) in its place, excluding its host from later placements, only when a
    standby is ready and the time it costs per step (a CPU straggler's excess over the median, a
    link straggler's rise of the collective time) x the steps left exceeds one recovery
    (``straggler_recovery_s``), and a CPU straggler has already cost one recovery since it was
    named (a burst of load a window long is kept): a job about to end keeps its straggler.
    ``off``: not watched, no probe server. Machine-wide load slows every group alike and names
    nobody."""

    straggler_factor: float = 1.5
    """A group slower than this multiple of its peers' median (compute, or collective seconds per
    step) is a straggler. 1.5: a rank at 30% of a CPU is 3x slower; load noise on a shared 2-core
    machine stays well within 1.5x between groups."""

    straggler_window: int = 10
    """A group's newest steps that are compared with its peers' same steps: a CPU straggler is slow
    on every one of them, or on 8 in 10 when it is 2 x ``straggler_factor`` slower (a CPU quota lets
    a short step run at full speed now and then); also the fewest steps a group needs before it is
    judged."""

    link_probe_s: float = 60.0
    """Seconds between two periodic probes of every rank's link (monarch_ft/controller/link_probe.py),
    besides those a rise of the collective time starts; 0: only those. A round moves 256 KiB twice
    each way per rank (1 MiB), one rank at a time: about 17 KB/s per rank at 60 s. The periodic one finds a link
    slow from the start (no rise to see); such a straggler is named, but an eviction weighs the
    rise it caused, none, so it is kept."""

    straggler_recovery_s: float = 10.0
    """Seconds one recovery (a standby's promotion: the survivors' stall while the Lighthouse drops
    the group, and the standby's healing) is taken to cost the job, in the eviction rule (see
    ``straggler``). 10 s: a standby promotion's MTTR on a loaded 2-core machine is 3-8 s."""

    def __post_init__(self) -> None:
        # 0: by the job's size; resolved here, so every reader (the Lighthouse's flags, the
        # Managers, the freeze watch, a saved config) sees the values the job runs with.
        self._worked_out: dict[str, int] = {}
        self.resolve_heartbeats()

    def resolve_heartbeats(self) -> None:
        """Set the heartbeats left at 0, or still at the value worked out for an earlier size, by
        the job's size now. Why again at :meth:`check`: a section built and then resized (a
        program setting ``replica_groups`` after construction, as the fakes and the benchmarks do)
        would keep the heartbeats of the size it was built with, and a value for the old size is
        no longer the default of the new one, so ``ft.lighthouse_addr`` would refuse it as a
        user's setting."""
        for key in ("heartbeat_interval_ms", "heartbeat_timeout_ms"):
            value = getattr(self, key)
            if not value or value == self._worked_out.get(key):
                setattr(self, key, 0)
        for key in ("heartbeat_interval_ms", "heartbeat_timeout_ms"):  # the timeout after the interval it spans
            if not getattr(self, key):
                self._worked_out[key] = self.resolved_defaults()[key]
                setattr(self, key, self._worked_out[key])

    def resolved_defaults(self) -> dict[str, Any]:
        """The defaults that depend on the rest of the section: the heartbeats, by the job's size
        (:func:`heartbeat_for` over the groups and the standbys, a Manager each; the timeout at
        least 4 x the interval in use). A value equal to one is no user's setting
        (:func:`monarch_ft.config.unused.changed`)."""
        interval, timeout = heartbeat_for(self.replica_groups + (self.standby_groups or 0))
        return {"heartbeat_interval_ms": interval, "heartbeat_timeout_ms": max(timeout, 4 * (self.heartbeat_interval_ms or interval))}

    def check(self) -> None:
        """What the types cannot say about this section (each failure one line naming the fix)."""
        self.resolve_heartbeats()
        require(self.replica_groups >= 1, f"ft.replica_groups={self.replica_groups}: need at least 1 replica group")
        require(self.ranks_per_group >= 1, f"ft.ranks_per_group={self.ranks_per_group}: need at least 1 rank per group")
        require(
            1 <= self.min_replica_size <= self.replica_groups,
            f"ft.min_replica_size={self.min_replica_size}: must be between 1 and ft.replica_groups={self.replica_groups}",
        )
        require(
            self.transport != "pg",
            "ft.transport=pg: TorchFT's PGTransport over the Manager's gloo group times out on receive with torchft 0.2.0; use sharded or http",
        )
        require(self.transport in TRANSPORTS, f"ft.transport={self.transport!r}: choose one of {', '.join(TRANSPORTS)}")
        require(
            self.cross_group_backend in CROSS_GROUP_BACKENDS,
            f"ft.cross_group_backend={self.cross_group_backend!r}: choose one of {', '.join(CROSS_GROUP_BACKENDS)}",
        )
        require(self.recovery in RECOVERY_MODES, f"ft.recovery={self.recovery!r}: choose one of {', '.join(RECOVERY_MODES)}")
        require(self.mode in SYNC_MODES, f"ft.mode={self.mode!r}: choose one of {', '.join(SYNC_MODES)}")
        require(
            self.global_batch in GLOBAL_BATCH_SETTINGS,
            f"ft.global_batch={self.global_batch!r}: choose one of {', '.join(GLOBAL_BATCH_SETTINGS)}",
        )
        require(
            self.mode == "hsdp" or self.global_batch != "constant",
            f"ft.global_batch=constant needs ft.mode=hsdp: with ft.mode={self.mode} the quorum runs at the end of each window, so the "
            "groups cannot take an absent group's data for the window it fails in; use ft.global_batch=shrink (or auto) with this mode",
        )
        require(
            self.fragments == 1 or self.mode == "diloco",
            f"ft.fragments={self.fragments}: fragments (streaming DiLoCo) need ft.mode=diloco",
        )
        # sync_every and outer_* are not refused in the modes that ignore them: a sweep across
        # modes (-m ft.mode=hsdp,diloco ft.sync_every=10) sets them for every mode at once.
        if self.mode != "hsdp":
            require(self.sync_every >= 1, f"ft.sync_every={self.sync_every}: must be >= 1")
            require(
                self.fragments >= 1 and self.sync_every % self.fragments == 0,
                f"ft.fragments={self.fragments}: must be >= 1 and divide ft.sync_every={self.sync_every}",
            )
            require(self.outer_lr > 0, f"ft.outer_lr={self.outer_lr}: must be > 0")
            require(0 <= self.outer_momentum < 1, f"ft.outer_momentum={self.outer_momentum}: must be in [0, 1)")
        if self.recovery == "full_restart":
            require(
                not self.standby_groups,
                f"ft.standby_groups={self.standby_groups} has no effect with ft.recovery=full_restart (it relaunches every group from disk, "
                "with no standby): drop it, or use ft.recovery=live",
            )
        if self.lighthouse_addr:
            refuse_unused(
                self,
                "ft",
                ("lighthouse_host", "lighthouse_port", "heartbeat_timeout_ms", "join_timeout_ms", "quorum_tick_ms"),
                f"with ft.lighthouse_addr={self.lighthouse_addr} (they configure the Lighthouse the controller starts; that one has its own)",
                "drop it, or unset ft.lighthouse_addr",
            )
        if self.transport != "sharded":
            refuse_unused(
                self,
                "ft",
                ("transport_interface",),
                f"with ft.transport={self.transport} (only the sharded transport binds where it says)",
                "drop it, or use ft.transport=sharded",
            )
        if self.cross_group_backend == "gloo":
            refuse_unused(
                self, "ft", ("nccl_hostid_per_group",), "with ft.cross_group_backend=gloo (no NCCL communicator across groups)", "drop it, or use nccl or auto"
            )
        error = standby_config_error(self.standby_groups)
        if error:
            raise ConfigError(error)
        require(self.max_restarts >= 0, f"ft.max_restarts={self.max_restarts}: must be >= 0")
        require(self.node_probation_s > 0, f"ft.node_probation_s={self.node_probation_s}: must be > 0")
        require(
            self.restart_window_s > 0,
            f"ft.restart_window_s={self.restart_window_s}: must be > 0 (the seconds within which at most ft.max_restarts relaunches of a group are allowed)",
        )
        try:
            hang_timeout = hang_timeout_setting(self.hang_timeout_s)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        require(
            hang_timeout is None or hang_timeout > self.timeout_s,
            f"ft.hang_timeout_s={self.hang_timeout_s} must exceed ft.timeout_s={self.timeout_s}: a rank blocked in a collective "
            "until its timeout would be taken for hung; raise ft.hang_timeout_s (or use auto)",
        )
        require(self.straggler in STRAGGLER_POLICIES, f"ft.straggler={self.straggler!r}: choose one of {', '.join(STRAGGLER_POLICIES)}")
        require(self.straggler_factor > 1, f"ft.straggler_factor={self.straggler_factor}: must be > 1 (a multiple of the peers' median)")
        require(self.straggler_window >= 3, f"ft.straggler_window={self.straggler_window}: must be >= 3 steps (a median of fewer is noise)")
        require(self.straggler_recovery_s >= 0, f"ft.straggler_recovery_s={self.straggler_recovery_s}: must be >= 0")
        require(self.link_probe_s >= 0, f"ft.link_probe_s={self.link_probe_s}: must be >= 0 (0: probe links only when the collective time rises)")
        if self.straggler == "off":
            refuse_unused(
                self,
                "ft",
                ("straggler_factor", "straggler_window", "link_probe_s"),
                "with ft.straggler=off (no group is watched for slowness)",
                "drop it, or use report or evict",
            )
        if self.straggler != "evict":
            refuse_unused(
                self, "ft", ("straggler_recovery_s",), f"with ft.straggler={self.straggler} (only evict weighs a recovery's cost)", "drop it, or use evict"
            )
        require(self.hang_min_s > 0, f"ft.hang_min_s={self.hang_min_s}: must be > 0")
        require(self.hang_step_factor >= 1, f"ft.hang_step_factor={self.hang_step_factor}: must be >= 1 (a multiple of the p99 step time)")
        require(self.os_stall_s > 0, f"ft.os_stall_s={self.os_stall_s}: must be > 0")
        require(self.asleep_s > 0, f"ft.asleep_s={self.asleep_s}: must be > 0")
        require(
            0 <= self.lighthouse_port <= 65535,
            f"ft.lighthouse_port={self.lighthouse_port}: must be 0 (a free port) or 1-65535",
        )
        require(self.heartbeat_interval_ms > 0, f"ft.heartbeat_interval_ms={self.heartbeat_interval_ms}: must be > 0")
        require(
            self.heartbeat_timeout_ms >= 4 * self.heartbeat_interval_ms,
            f"ft.heartbeat_timeout_ms={self.heartbeat_timeout_ms}: must be at least 4 x ft.heartbeat_interval_ms={self.heartbeat_interval_ms} "
            "(a live group missing a few heartbeats on a loaded host would be evicted); raise it or lower ft.heartbeat_interval_ms",
        )
        require(self.stall_timeout_s >= 0, f"ft.stall_timeout_s={self.stall_timeout_s}: must be >= 0")
        try:
            integrity_setting(self.integrity_every)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        require(0 < self.integrity_budget < 1, f"ft.integrity_budget={self.integrity_budget}: must be between 0 and 1 (a share of a step's time)")
        require(self.grad_outlier_factor > 1, f"ft.grad_outlier_factor={self.grad_outlier_factor}: must be > 1 (a multiple of the median norm)")
        require(self.grad_history >= 10, f"ft.grad_history={self.grad_history}: must be >= 10 (the check judges by norm once it has 10)")
        require(self.suspect_vetoes >= 1, f"ft.suspect_vetoes={self.suspect_vetoes}: must be >= 1")


def standby_config_error(configured: Optional[int], launcher: str = "") -> Optional[str]:
    """One line naming the fix for an ``ft.standby_groups`` that cannot run, else None."""
    if configured is None:
        return None
    if configured < 0:
        return f"ft.standby_groups={configured}: must be >= 0 (0 disables warm standby groups)"
    return None


AUTO = "auto"


def hang_timeout_setting(value: Any) -> Optional[float]:
    """``ft.hang_timeout_s``: None for ``auto``, else the fixed number of seconds.

    Raises:
        ValueError: neither ``auto`` nor a positive number.
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"ft.hang_timeout_s={value!r}: use auto or a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"ft.hang_timeout_s={value!r}: must be > 0 (or auto)")
    return seconds


def integrity_setting(value: Any) -> Optional[int]:
    """``ft.integrity_every``: None for ``auto``, else the fixed number of steps (0: off).

    Raises:
        ValueError: neither ``auto`` nor a whole number >= 0.
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        steps = int(str(value).strip())
    except (TypeError, ValueError):
        raise ValueError(f"ft.integrity_every={value!r}: use auto, 0 (off) or a number of steps") from None
    if steps < 0:
        raise ValueError(f"ft.integrity_every={value!r}: must be >= 0 (0: off) or auto")
    return steps
