"""The per-rank training loop: TorchTitan's model, optimizer, LR schedule and
checkpointing, with a TorchFT Manager across replica groups.

Why a thin trainer of our own rather than ``torchtitan.train``: TorchTitan 0.2.x's
trainer assumes an accelerator (``cuda`` device fallback, ``barrier(device_ids=...)``
that gloo rejects), so on CPU we reuse its components directly and keep the loop
small. The same loop runs NCCL + CUDA when a GPU is present (monarch_ft/common/devices.py:
which GPU, which backend in and across groups).

Step protocol (per step, every rank):
  start_quorum -> forward/backward (FSDP2 inside the group) -> cross-group average of
  the local grad shards through the Manager -> should_commit -> optimizer step.
A group that finishes ``training.steps`` while the supervisor holds the job open
(another group is being restarted) keeps joining quorums with zero gradients and
*no* optimizer step, so the restarted group can heal from it; the optimizer is
applied only for steps below ``training.steps`` on every group, so weights agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import hashlib
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from monarch_ft.common import proctitle
from monarch_ft.common.data import TokenBatches
from monarch_ft.common.devices import cross_group_backend, cuda_index, device_type, set_nccl_hostid
from monarch_ft.config.job import JobConfig
from monarch_ft.rank.components.checkpoint import SaveWatchdog, TrainState, build_checkpointer, describe_error, remove_partial, save_due, storage_error
from monarch_ft.rank.components.fault_agent import FaultAgent
from monarch_ft.config.ft import integrity_setting
from monarch_ft.rank.components.freeze import FreezeWatch
from monarch_ft.rank.components.global_batch import StepSlots
from monarch_ft.rank.components.ft import CommitFloor, FTParts, build_cross_group, build_manager, load_in_place, to_local_tree
from monarch_ft.rank.components.integrity import GradGuard, IntegrityInterval, StateMismatch, fingerprint, local_grad_norm, named_tensors
from monarch_ft.rank.components.lease import ControllerLease
from monarch_ft.rank.components.metrics import Liveness, RankReporter, build_metric_sinks
from monarch_ft.rank.components.model import build_model, param_name
from monarch_ft.rank.components.sync import build_sync, checkpoint_interval, uses_async_quorum
from monarch_ft.rank.link_probe import start_probe_server
from monarch_ft.records.decisions import StateDecision, StateSource
from monarch_ft.records.members import members_field
from monarch_ft.records.events import EventKind
from monarch_ft.records.exits import RankExit
from monarch_ft.records.global_batch import resolve as resolve_global_batch
from monarch_ft.records.global_batch import step_tokens
from monarch_ft.records.layout import RunLayout, read_int, read_json
from monarch_ft.records.manifest import describe_os_error, errno_name, manifest_fingerprint, step_dir
from monarch_ft.records.phases import Phase
from monarch_ft.records.reports import compute_seconds, error_record


@dataclass
class RankSpec:
    """Everything one rank needs; written by the supervisor as JSON."""

    config: dict
    group: int
    rank: int
    world_size: int
    attempt: int
    store_host: str
    store_port: int
    lighthouse_addr: str
    advertise_host: str
    run_dir: str
    report_path: str
    hold_path: str
    tokens_path: str
    # Checkpoint step to load before reporting model_ready: -1 the latest, None nothing;
    # and the step directory the supervisor verified for it (None: the group's own copy).
    load_step: Optional[int] = None
    load_path: Optional[str] = None
    scratch_dir: str = ""
    # A file the rank waits for before its first step ("" for none): a shared start gate
    # (Supervisor._open_start_gate) or the group's own launch gate, whose JSON content says
    # where its state comes from (records.decisions.StateDecision; controller.decide.recovery.open_launch_gates).
    start_gate: str = ""
    # A warm standby (monarch_ft.rank.standby_wait): its number, and the promotion file it waits for
    # after building everything identity-free; "" / -1 for a rank of a replica group.
    promotion_path: str = ""
    standby: int = -1


def state_hash(tree: Any) -> str:
    """Digest of every tensor's bytes (hashlib over a uint8 view: no Python byte copies)."""
    h = hashlib.blake2b(digest_size=16)

    def visit(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous().cpu()
            h.update(f"{path}:{t.dtype}:{tuple(t.shape)};".encode())
            if t.numel():
                h.update(t.view(-1).view(torch.uint8).numpy())
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                visit(obj[k], f"{path}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                visit(v, f"{path}[{i}]")
        else:
            h.update(f"{path}={obj!r};".encode())

    visit(tree, "")
    return h.hexdigest()


class StopAt:
    """``training.steps``, or an earlier step the controller asks every group to stop at.
    The file's number only comes down (records.lease.lower_finish: a ``stop`` after a drill
    asked for a later finish); it is read every step and the lowest seen kept (a few bytes
    read per step).

    A read alone is not a decision the groups share. The number lands while they step, and
    two groups of one quorum can read it on either side of the write at the top of the same
    step. Had each decided on its own read, a finish at or below that step stopped one group
    there while the other trained the step alone once the first had left: the job ended on two
    different weights (CI at a1c0f44: the last commit was one group's; the writer asked for its
    view of the job's step plus a margin, and its view lagged). So a group decides on the
    finish its last step's quorum *agreed* (:attr:`agreed`): in hsdp each group offers what it
    read in the step's gradient collective (rank.components.ft.GradSync), every group of the
    quorum learns the lowest offer, and from the next step that is the finish in force
    (:meth:`agree`). A finish read in time stops every group at it; one read late stops them
    all at one common step after it. In localsgd/diloco the offers travel in the sync's
    membership allreduce (rank.components.sync.SemiSync), so the finish in force changes only
    at a sync point, where the groups stand on one step: a window is never cut short.
    """

    def __init__(self, path: str, steps: int) -> None:
        self.path = path
        self._value = steps
        self.agreed: Optional[int] = None

    def steps(self) -> int:
        self._value = min(self._value, read_int(self.path, self._value))
        return self._value

    def in_force(self, read: int) -> int:
        """The finish a step decides on: the agreed one; before this process's first
        quorum, ``read`` (its own read, aligned and agreed within its group)."""
        if self.agreed is None:
            self.agree(read)
        return self.agreed

    def agree(self, finish: int) -> None:
        """Take ``finish`` as the finish in force: the lowest offer of a step's quorum, the same
        number for every group of it, a healing one too (the file only comes down, so it is no
        later than anything read before); or, before this process's first quorum, its own
        first read (a relaunched group reads what is in force, and in the step it heals in it
        follows its peers' decision, not its own)."""
        self.agreed = finish


def apply_scheduler_lr(lr_schedulers) -> None:
    """LambdaLR.load_state_dict restores the schedule position but leaves the optimizer's
    current lr stale until the next step(); set it now so a healed or resumed group
    takes exactly the step its peers take."""
    for scheduler in lr_schedulers.schedulers:
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr


def _config(spec: RankSpec) -> JobConfig:
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(JobConfig), spec.config))


class Trainer:
    """One rank of one replica group, in the shape of TorchTitan's ``Trainer``: the
    components are built in ``__init__``, :meth:`train` runs :meth:`train_step` until the
    job's last step and :meth:`hold_step` while finished groups keep the job open,
    :meth:`state_dict`/:meth:`load_state_dict` are what a healing peer moves (through
    TorchFT), and :meth:`close` releases everything.

    Construction is two parts, so a warm standby (monarch_ft.rank.standby_wait) can do the first
    long before it knows which group it will be:

    - :meth:`_build_local`, identity-free: device, the group's own store and in-group
      process group, the model built and sharded, optimizer state materialised, LR
      schedule, data opened, and the cross-group process group and checkpoint transport
      (neither talks to the Lighthouse);
    - :meth:`_bind`, identity-bound: the TorchFT Manager (it heartbeats the Lighthouse from
      construction on), the sync strategy, checkpointer, fault agent, scratch files.

    Args:
        spec: the rank's spec (the supervisor's JSON).
    """

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.cfg = _config(spec)
        self.layout = RunLayout(spec.run_dir, self.cfg.checkpoint.folder)
        # A waiting standby has no group yet: its sinks (TensorBoard) come with its promotion.
        sinks = [] if spec.promotion_path else build_metric_sinks(self.cfg.metrics, self.layout, spec.group, spec.rank, spec.attempt)
        self.reporter = RankReporter(spec.report_path, spec.group, spec.rank, spec.attempt, sinks)
        self.reporter.event(EventKind.RANK_STARTED)
        self.liveness = Liveness(self.reporter)
        # Stacks on demand (the supervisor's fallback when py-spy cannot read this process).
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        self._decision: Optional[StateDecision] = None
        with self.reporting_errors():
            self._build_local()
            if spec.promotion_path:
                self._await_promotion()
            self._bind()

    @contextlib.contextmanager
    def reporting_errors(self) -> Iterator[None]:
        """An exception escaping the rank is first written to its report file as ``rank_error``
        (its last traceback line and innermost frame: records.reports.error_record), then raised on
        (the traceback goes to the rank's log, the rank exits non-zero). The controller names
        the failure with it and tells a crash loop by it (controller.budget.crash_loop). Deliberate
        exits (``os._exit`` with a RankExit code, SystemExit) are not exceptions of this kind
        and are not reported so."""
        try:
            yield
        except Exception as e:
            try:
                self.reporter.event(EventKind.RANK_ERROR, **error_record(e))
            except Exception:
                pass  # the report file itself failed (a full disk): the log still has the traceback
            raise

    # ------------------------------------------------------------ construction
    def _build_local(self) -> None:
        """Everything that does not depend on which replica group this rank serves."""
        if not self.spec.store_host:
            self.spec = _on_this_node(self.spec, self.cfg.ft.transport_interface)
        spec, cfg, tr = self.spec, self.cfg, self.cfg.training
        torch.set_num_threads(tr.threads_per_rank)
        self.use_cuda = use_cuda = device_type(tr.device) == "cuda"
        if tr.device == "cuda" and not use_cuda:
            raise RuntimeError(f"training.device=cuda but torch sees no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})")
        self.xgroup_backend = cross_group_backend(cfg.ft.cross_group_backend, "cuda" if use_cuda else "cpu")
        self.device = device = torch.device("cpu")
        self.nccl_hostid = None
        if use_cuda:
            self.device = device = torch.device("cuda", cuda_index(spec.group, spec.rank, spec.world_size, torch.cuda.device_count()))
            torch.cuda.set_device(device)
            if cfg.ft.nccl_hostid_per_group:
                # Before the first NCCL communicator of this process: NCCL reads it then.
                self.nccl_hostid = set_nccl_hostid(spec.group)

        # The group's own store: rank 0 hosts it (a fresh port per launch attempt), the
        # in-group process group and the TorchFT Manager are its clients.
        self.store = dist.TCPStore(
            spec.store_host,
            spec.store_port,
            world_size=spec.world_size,
            is_master=spec.rank == 0,
            timeout=timedelta(seconds=cfg.ft.connect_timeout_s * 3),
            wait_for_workers=False,
        )
        dist.init_process_group(
            "nccl" if use_cuda else "gloo",
            store=dist.PrefixStore("group", self.store),
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=cfg.ft.timeout_s * 3),
            # Binds the rank's GPU to its NCCL group (eager init on that device).
            **({"device_id": device} if use_cuda else {}),
        )
        mesh = None
        if spec.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (spec.world_size,), mesh_dim_names=("fsdp",))

        from torch.distributed.checkpoint.state_dict import _init_optim_state
        from torchtitan.components.lr_scheduler import build_lr_schedulers
        from torchtitan.components.optimizer import OptimizersContainer
        from torchtitan.config.job_config import LRScheduler

        self.model = build_model(cfg.model, tr.seq_len, mesh, device, tr.seed, tr)
        self.optimizers = OptimizersContainer(
            [self.model],
            torch.optim.AdamW,
            {"lr": tr.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": tr.weight_decay, "foreach": True},
        )
        self.optimizer = self.optimizers.optimizers[0]
        # Materialise the optimizer state now (a zero-lr step, as torch's own state-dict
        # loader does) so a healing group can receive into it in place.
        _init_optim_state(self.optimizer)
        if tr.compile:
            self._compile_now()
        self.lr_schedulers = build_lr_schedulers(self.optimizers, LRScheduler(warmup_steps=tr.warmup_steps), tr.steps)
        # Captured once: FSDP2 keeps these sharded parameter objects for the whole run.
        # model.state_dict() must not be called from the Manager's quorum thread while the
        # main thread runs forward (FSDP2 swaps registered params around forward/backward).
        # Named without the knobs' wrappers: a heal, a fingerprint, a state hash see one name per parameter.
        self.params = {param_name(n): p for n, p in self.model.named_parameters()}
        self.batches = TokenBatches(spec.tokens_path, tr.batch_size, tr.seq_len, tr.seed)
        # Reports go through self.reporter at call time: a promoted standby re-points it.
        self.cross = build_cross_group(
            cfg.ft,
            lighthouse_addr=spec.lighthouse_addr,
            report=lambda *a, **k: self.reporter.event(*a, **k),
            backend=self.xgroup_backend,
            fallback_peers=self._fallback_peers,
        )

    def _compile_now(self) -> None:
        """training.compile: compile the blocks' forward and backward here, in the startup phase,
        on a batch of the training shape. torch.compile compiles lazily, on the first step; a cold
        compilation takes tens of seconds to minutes on CPU, past what the hang rules allow a step
        (monarch_ft.controller.hangs: a step computing longer than the hang timeout is hung) but
        within the startup budget (``ft.startup_timeout_s``). Every rank of the group builds at
        once, so the warm-up's FSDP collectives meet; its gradients are dropped, the weights and the
        optimizer's state are untouched, and later steps of the same shape reuse the compiled code."""
        tr = self.cfg.training
        tokens = torch.zeros((tr.batch_size, tr.seq_len), dtype=torch.long, device=self.device)
        self.model(tokens).float().mean().backward()
        self.optimizers.zero_grad()

    def _fallback_peers(self, src_rank: int, step: int) -> list[str]:
        """Where this rank's shard is also served, by the other stepping groups (the controller's
        list, RunLayout.transport_peers): a chunk from the healing source that fails its
        checksum is fetched again from one of them. Read when a heal needs it, by the group this
        rank is then (a standby learns its group at its promotion)."""
        peers = read_json(self.layout.transport_peers, {}) or {}
        mine = str(self.spec.group)
        return [m for g, ranks in sorted(peers.items()) if g != mine for r, m in ranks.items() if r == str(self.spec.rank)]

    def _await_promotion(self) -> None:
        """A warm standby: report ready, wait (no CPU to speak of) for the promotion file,
        then become the group it names: its report files, attempt and the supervisor's
        decision on where its state comes from (monarch_ft.rank.standby_wait)."""
        from monarch_ft.common.process import outlive_parent
        from monarch_ft.common.cpu_priority import to_foreground
        from monarch_ft.rank.standby_wait import ControllerWatch, orphan_after_s, promoted_spec, wait_for_promotion

        self.liveness.enter(Phase.STANDBY)
        self.reporter.event(EventKind.STANDBY_READY, standby=self.spec.standby)
        waited = time.time()
        ctl = self.cfg.controller
        watch = ControllerWatch(self.layout.controller_heartbeat, orphan_after_s(ctl.heartbeat_s, ctl.lease_s))
        promotion = wait_for_promotion(self.spec.promotion_path, orphaned=watch.gone)
        if isinstance(promotion, str):
            # Its controller is gone: nothing will promote it; free what it holds (a Slurm job).
            self.reporter.event(EventKind.STANDBY_ORPHANED, standby=self.spec.standby, reason=promotion)
            os._exit(0)
        # A training rank from now on: it outlives its controller (it was launched to die with it).
        outlive_parent()
        self.liveness.enter(Phase.STARTUP)
        self.spec = promoted_spec(self.spec, promotion)
        proctitle.retitle(proctitle.rank_role(self.spec.group, self.spec.rank, self.spec.attempt))
        self.reporter.event(EventKind.STANDBY_PROMOTED_RANK, group=promotion.group, attempt=promotion.attempt, waited_s=round(time.time() - waited, 3))
        self.reporter.retarget(
            self.spec.report_path,
            self.spec.group,
            self.spec.attempt,
            build_metric_sinks(self.cfg.metrics, self.layout, self.spec.group, self.spec.rank, self.spec.attempt),
        )
        renice_error = to_foreground()
        self.reporter.event(
            EventKind.RANK_STARTED, standby=promotion.standby, promotion_latency_s=round(time.time() - promotion.promoted_at, 3), renice_error=renice_error
        )
        self._decision = promotion.decision

    def _bind(self) -> None:
        """Everything that makes this rank a member of replica group ``spec.group``."""
        spec, cfg, tr = self.spec, self.cfg, self.cfg.training
        if spec.scratch_dir:
            # Host-local scratch: what a node fault takes away with the host.
            os.makedirs(spec.scratch_dir, exist_ok=True)
            with open(os.path.join(spec.scratch_dir, "rank.json"), "w") as f:
                f.write(f'{{"pid": {os.getpid()}, "attempt": {spec.attempt}}}\n')
        self.ft: FTParts = build_manager(
            cfg.ft,
            self.cross,
            group=spec.group,
            rank=spec.rank,
            world_size=spec.world_size,
            store_addr=spec.store_host,
            store_port=spec.store_port,
            lighthouse_addr=spec.lighthouse_addr,
            hostname=spec.advertise_host,
            state_dict=self.state_dict,
            load_state_dict=self.load_state_dict,
            use_async_quorum=uses_async_quorum(cfg.ft),
            lighthouse_epoch_path=self.layout.lighthouse_epoch,
        )
        self.manager = self.ft.manager
        # A rank frozen past the heartbeat timeout asks for no quorum until its peers frozen
        # with it are seen alive again: else each may get a quorum of its own (a split brain).
        hb_s = cfg.ft.heartbeat_timeout_ms / 1000
        self.freeze = FreezeWatch(threshold_s=hb_s, settle_s=2 * hb_s, tick_s=cfg.ft.heartbeat_interval_ms / 1000)
        self.manager.before_quorum = self._settle_after_freeze
        self.floor = CommitFloor(self.layout.commit_floor)
        # ft.mode: how groups synchronise (monarch_ft/rank/components/sync.py).
        self.sync = build_sync(cfg.ft, self.manager, self.model, self.optimizer, self.lr_schedulers, self.params, spec.group, self.floor, self._refuse_commit)
        # ft.global_batch: which data slots this group trains at each step (hsdp).
        policy = resolve_global_batch(cfg.ft.global_batch, cfg.ft.mode)
        self.step_slots = StepSlots(policy, cfg.ft.replica_groups, spec.group, self._group_min_tensor, self.device)
        # localsgd/diloco write checkpoints at sync points only.
        self.ckpt_cfg = dataclasses.replace(cfg.checkpoint, interval=checkpoint_interval(cfg.ft, cfg.checkpoint.interval))
        # Silent data corruption (rank.components.integrity): state fingerprints every
        # ft.integrity_every steps, and (hsdp) each rank's gradient check before the average.
        self.integrity = IntegrityInterval(integrity_setting(cfg.ft.integrity_every), self.layout.integrity_every)
        self.grad_guard = GradGuard(cfg.ft.grad_outlier_factor, cfg.ft.grad_history) if cfg.ft.grad_check and not self.sync.semi_sync else None
        self._grad_norm: Optional[float] = None
        self.train_state = TrainState()
        self.checkpointer = build_checkpointer(
            self.ckpt_cfg,
            spec.run_dir,
            spec.group,
            self.model,
            self.optimizers,
            self.lr_schedulers,
            {"train_state": self.train_state, "ft_manager": self.manager, **self.sync.checkpoint_states()},
            tr.seed,
            fingerprint=lambda: fingerprint(self._saved_state()).digest,
        )
        self.loaded_step: Optional[int] = None
        # The step of the newest save tried, or of the checkpoint loaded: on disk already
        # (see :meth:`save_final`).
        self.saved_step = -1
        if cfg.checkpoint.enable and spec.load_step is not None:
            self.load_checkpoint(spec.load_step, spec.load_path)
        self.fault_agent = FaultAgent(self.layout, spec.group, spec.rank, self.reporter.event)
        self.save_watchdog = SaveWatchdog(
            cfg.checkpoint.save_timeout_s,
            self.reporter.event,
            os.path.join(self.layout.stacks_dir, f"save-timeout-{self.layout.tag(spec.group, spec.rank, spec.attempt)}.txt"),
        )
        self.stop_at = StopAt(self.layout.stop_at_step, tr.steps)
        # The finish this group read at the top of the step: what it offers its quorum.
        self._finish_read: Optional[int] = None
        # No controller for controller.lease_s (or an unanswered stop): the job ends itself.
        self.lease = ControllerLease(self.layout.controller_heartbeat, self.layout.stop_request, cfg.controller.lease_s, cfg.controller.heartbeat_s)
        self.tokens_per_step = tr.batch_size * tr.seq_len
        # Where the controller times this rank's link (rank.link_probe): a slow link is named by it.
        self.link_probe = start_probe_server(spec.advertise_host) if cfg.ft.straggler != "off" and spec.advertise_host else None
        self.announced_done = False
        self.last_heartbeat = 0.0
        self.reporter.event(
            EventKind.MODEL_READY,
            step=self.manager.current_step(),
            params=sum(p.numel() for p in self.model.parameters()),
            transport_metadata=self.ft.checkpoint_metadata(),
            link_probe=self.link_probe.address if self.link_probe is not None else None,
            device=str(self.device),
            device_name=torch.cuda.get_device_name(self.device) if self.use_cuda else None,
            group_backend=dist.get_backend(),
            cross_group_backend=self.xgroup_backend,
            nccl_version=".".join(map(str, torch.cuda.nccl.version())) if self.use_cuda else None,
            nccl_hostid=self.nccl_hostid,
            # The order of the tensors in this rank's state fingerprints (records.integrity).
            fingerprint_names=[n for n, _ in named_tensors(self.sync.consistent_state(self.state_dict()))] if self.integrity.enabled else None,
        )

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """What a healing peer receives (this rank's shard only); called from the Manager's
        quorum thread, so it reads the parameter objects captured once, never the module."""
        return {
            "model": {name: p.to_local() if hasattr(p, "to_local") else p for name, p in self.params.items()},
            "optim": {name: to_local_tree(self.optimizer.state[p]) for name, p in self.params.items()},
            "lr_scheduler": self.lr_schedulers.state_dict(),
        }

    def _saved_state(self) -> dict:
        """The model and optimizer state (this rank's shard): what a checkpoint holds and a
        fingerprint in its manifest vouches for, whatever ft.mode."""
        return {k: v for k, v in self.state_dict().items() if k != "lr_scheduler"}

    def _check_grads(self, step: int, micro_batches: int = 1) -> Optional[dict]:
        """This rank's gradient norm against its recent ones (GradGuard), before the average;
        the verdict when it is an outlier (then reported), else None. A gradient summed over
        several micro-batches (ft.global_batch=constant) is judged as their mean."""
        if self.grad_guard is None:
            return None
        self._grad_norm = local_grad_norm(list(self.params.values())) / micro_batches
        outlier = self.grad_guard.judge(self._grad_norm)
        if outlier is not None:
            self.reporter.event(EventKind.GRAD_OUTLIER, step=step, **outlier)
        return outlier

    def load_state_dict(self, state: dict) -> None:
        """Take a peer's state in place: the FSDP parameters and optimizer tensors stay the
        very objects the loop holds."""
        live = self.state_dict()
        load_in_place(live["model"], state["model"], "model")
        load_in_place(live["optim"], state["optim"], "optim")
        self.lr_schedulers.load_state_dict(state["lr_scheduler"])
        apply_scheduler_lr(self.lr_schedulers)

    def load_checkpoint(self, step: int, path: Optional[str] = None) -> None:
        """Load disk checkpoint ``step`` (from ``path``, the copy the supervisor verified).

        A load that raises ends the rank with ``RankExit.CHECKPOINT_LOAD_FAILED`` after
        reporting ``checkpoint_load_failed`` (the step, the copy, the error in one line; the
        traceback goes to the rank's log). DCP's load is collective, so every rank of the
        group fails alike. The supervisor then quarantines that copy and decides again (an
        older step, or a live peer): the exception must not escape the rank, where it would
        read as a crash of the rank's own (and a crash loop once repeated)."""
        try:
            loaded = self.checkpointer.load_path(step, path)
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self._load_failed(step, path, e)
        if loaded:
            problem = self._loaded_state_problem(step, path)
            if problem is not None:
                self._load_failed(step, path, StateMismatch(problem))
        apply_scheduler_lr(self.lr_schedulers)
        # In inner steps, as checkpoints are numbered (localsgd/diloco's Manager counts syncs).
        self.loaded_step = self.sync.steps_done() if loaded else None
        if loaded:
            self.sync.after_checkpoint_load()
            self.saved_step = self.sync.steps_done()
        self.reporter.event(EventKind.CHECKPOINT_LOADED if loaded else EventKind.CHECKPOINT_MISSING, step=self.sync.steps_done())

    def _loaded_state_problem(self, step: int, path: Optional[str]) -> Optional[str]:
        """Whether the state just loaded is the one its manifest's fingerprint vouches for (None:
        it is, or the manifest has none). File checksums vouch for bytes; this for what they
        hold, so a copy whose files were changed and its manifest rewritten to match is caught."""
        where = path or step_dir(self.checkpointer.folder, self.train_state.step if step < 0 else step)
        expected = manifest_fingerprint(where).get(self.spec.rank)
        if expected is None:
            return None
        got = fingerprint(self._saved_state()).digest
        if got == expected:
            return None
        return f"the state it loaded (fingerprint {got}) is not the one its manifest vouches for ({expected}): files changed under a rewritten manifest"

    def _load_failed(self, step: int, path: Optional[str], e: BaseException) -> None:
        traceback.print_exception(e, file=sys.stderr)
        path = path or step_dir(self.checkpointer.folder, step)
        self.reporter.event(EventKind.CHECKPOINT_LOAD_FAILED, step=step, path=path, error=describe_error(e))
        self.reporter.close()
        sys.stderr.flush()
        os._exit(int(RankExit.CHECKPOINT_LOAD_FAILED))

    def save_checkpoint(self, step: int, last_step: bool) -> None:
        """Save ``step``; a save the storage refuses is a recoverable event, not a rank death.

        The live replicas hold the state, so training goes on and the next interval tries
        again. Every rank of the group sees the same failure at the same point (DCP and the
        manifest are collectives that hand every rank the gathered outcome), so all of them
        carry on together; rank 0 then removes the partial step (it frees its space and is
        never mistaken for a checkpoint; older steps stay) and reports
        ``checkpoint_save_failed`` with the errno and the path. Anything else that fails a
        save (a bug, a peer gone) still ends the rank."""
        self.saved_step = step
        try:
            with self.save_watchdog.guard(step):
                self.fault_agent.during_save()
                self.checkpointer.save(step, last_step=last_step)
        except BaseException as e:
            refused = storage_error(e)
            if refused is None:
                raise
            print(f"monarch_ft: checkpoint save of step {step} failed, training goes on: {describe_error(e)}", file=sys.stderr, flush=True)
            if self.spec.rank != 0:
                return
            partial = step_dir(self.checkpointer.folder, step)
            self.reporter.event(
                EventKind.CHECKPOINT_SAVE_FAILED,
                step=step,
                errno=errno_name(refused),
                path=refused.filename or partial,
                error=describe_os_error(refused),
                removed_partial=remove_partial(partial),
            )

    def _refuse_commit(self, step: int, job_step: int) -> None:
        # Never commit below the job's step (see CommitFloor): vote against this commit, and
        # give up once it is clear that nobody in the quorum can heal this group.
        self.reporter.event(EventKind.COMMIT_REFUSED, step=step, job_step=job_step, refusals=self.floor.refusals)
        if self.floor.refusals >= self.floor.MAX_REFUSALS:
            self.reporter.close()
            os._exit(int(RankExit.COMMIT_BELOW_FLOOR))
        self.manager.report_error(RuntimeError(f"step {step} is below the job's committed step {job_step}"))

    # ------------------------------------------------------------ loop
    def wait_start(self) -> None:
        """The job's first launch (and each full restart) starts training together: a group
        ready early would otherwise train alone and make the others heal from it.

        A relaunched group's gate says where its state comes from, decided when it is ready
        (the peers alive at its launch may be gone): a live peer heals it in the quorum; with
        none left, the newest checkpoint (aligned into this group's folder by the supervisor)."""
        spec = self.spec
        if self._decision is not None:  # a promoted standby: decided at its promotion
            self.apply_state_decision(self._decision)
            return
        self.liveness.enter(Phase.GATE)
        while spec.start_gate and not os.path.exists(spec.start_gate):
            self.lease.exit_at_gate(self.reporter.event, self.manager.current_step())
            self.reporter.heartbeat(step=self.manager.current_step(), waiting="start")
            time.sleep(0.05)
        self.apply_state_decision(StateDecision.from_record(read_json(spec.start_gate, {})) if spec.start_gate else None)

    def apply_state_decision(self, decision: Optional[StateDecision]) -> None:
        """The supervisor's decision on where this group's state comes from (records.decisions:
        a launch gate's or a promotion's; None: a shared start gate, the state loaded before it)."""
        if decision is not None and decision.source is StateSource.DISK and self.loaded_step != decision.step:
            self.load_checkpoint(int(decision.step), decision.path)
        # localsgd/diloco: heal at the peers' next sync point before training anything.
        self.sync.join_pending = self.sync.semi_sync and decision is not None and decision.source is StateSource.PEER

    def _forward_backward(self, batch) -> torch.Tensor:
        inputs, labels = batch
        logits = self.model(inputs.to(self.device))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.to(self.device).flatten())
        loss.backward()
        return loss

    def group_min(self, value: int) -> int:
        """The lowest ``value`` among this group's ranks (itself, in a group of one).

        What decides whether a rank trains another step must be one decision for the whole
        group: its ranks run the same collectives in the same order (FSDP's, DCP's), and one rank
        that trains while another saves or stops leaves both waiting in different collectives
        until the timeout fails the group. The finish and the hold are read from files, by each
        rank by itself, at slightly different times; a ``stop`` landing between two ranks' reads
        would split them. The finish file only comes down, so the lowest read is the newest; a
        hold goes on only while every rank still holds. One all-reduce of one integer per step,
        and only in groups of several ranks."""
        if self.spec.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def _group_min_tensor(self, t: torch.Tensor) -> None:
        """``t`` becomes its element-wise lowest across this group's ranks (see :meth:`group_min`)."""
        if self.spec.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN)

    def save_final(self, step: int, last: int) -> None:
        """The last step's checkpoint, where the step's own save did not happen.

        A step saves as the last one when it is the finish this rank read before training it.
        A ``stop`` writes its finish while the groups step: the controller asks for its view
        of the job's step plus a margin (records.lease.controller_finish_margin), and that view
        lags the groups by the report relay's delay, so a group can be training the very step asked for when the number
        lands, read the new finish only after committing it, and would end with no
        checkpoint of its last step (CI at cd3a267: one group of two had none). A finish the
        quorum read late (at or below its step) ends every group past it, on one common step
        (StopAt; in localsgd/diloco a sync point): that step is the last and is saved here too. The group's
        ranks agree on ``last`` (:meth:`group_min`) and each saves it exactly once, in its step
        or here, so they enter the save's collectives together."""
        if self.cfg.checkpoint.enable and step >= last and self.saved_step != step:
            self.liveness.enter(Phase.SAVE)
            self.save_checkpoint(step, last_step=True)

    def hold_step(self, step: int) -> bool:
        """Past the last step: keep serving quorums while the supervisor holds the job open
        (another group is being restarted). False once the hold is lifted (the loop ends)."""
        self.liveness.enter(Phase.HOLD)
        if not self.announced_done:
            self.reporter.event(EventKind.TRAIN_DONE, step=step)
            self.announced_done = True
        if not os.path.exists(self.spec.hold_path) or self.lease.ended():
            return False
        if time.time() - self.last_heartbeat > 1.0:
            self.reporter.heartbeat(step=step)
            self.last_heartbeat = time.time()
        time.sleep(0.1)
        return True

    def train_step(self, step: int, last: int) -> None:
        """One step: quorum, forward/backward (or zero grads when holding), cross-group
        sync, commit vote, optimizer step; then the step record and a checkpoint when due."""
        spec, tr, manager = self.spec, self.cfg.training, self.manager
        training = step < last
        start = time.time()
        healed, batch_index, synced = False, step, True
        vetoes: list[int] = []
        self._grad_norm = None
        # A drill's bit flip (chaos bitflip), or a test's armed transfer fault, lands here.
        self.fault_agent.before_step(step, self._saved_state, self.ft)
        slots: tuple = ()
        micro_batches = 0
        sums = None
        if self.sync.semi_sync:
            self.sync.finish_offer = self._finish_read
            res = self.sync.step(
                training,
                last,
                lambda pos: self._forward_backward(self.batches.batch(pos, spec.group, spec.rank)),
                lambda: torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0, foreach=True),
                lambda: self.fault_agent.before_allreduce(self.ft),
                lambda phase: self.liveness.enter(phase, fresh=True),
            )
            apply_update = res is not None
            agreed = self.sync.take_agreed_finish()
            if agreed is not None:
                self.stop_at.agree(agreed)  # at a sync; in force from the next step (StopAt)
            if res is not None:
                step, committed, loss, members = res.step, res.committed, res.loss, res.members
                healed, batch_index, synced, sums = res.healed, res.batch, res.synced, res.sums
                slots = (spec.group,) if res.batch is not None else ()
                # A sync averages the windows of the groups counted in it, each window one slot per step.
                micro_batches = len(members) * self.sync.window if res.synced else 0
        else:
            self.liveness.enter(Phase.SYNC)  # waits for the previous step's quorum, if still running
            manager.start_quorum()
            # Until this step's commit vote the state cannot change: serve it to a healing peer
            # whose chunk from TorchFT's chosen source failed its checksum.
            self.ft.offer_state()
            self.liveness.enter(Phase.COMPUTE)
            self.optimizers.zero_grad()
            losses = []
            if training:
                # Its own slot first, while the quorum runs (every group trains it in a fault-free step).
                losses.append(self._forward_backward(self.batches.batch(step, spec.group, spec.rank)))
            # ft.global_batch: the slots this group trains now that the step's participants are
            # known (constant: an absent group's too; none while this group heals in the step).
            # (It waits for the step's quorum: a wait of the sync phase, which may last a join
            # timeout. Marked compute, a promoted standby waiting out its first quorum was judged
            # asleep in compute: hung. A step in which a group heals waits for that heal too, in
            # the participants' collective: marked compute, each group that waited a second for a
            # peer healing over a slow link was judged hung in turn, until no group held the
            # job's state and the job went back to its checkpoint (the straggler drill beside two
            # CPU hogs; StepSlots.may_wait). But the hang rules compare the start of the group's
            # ranks' compute spells to blame the one that stopped first (hangs.asleep_in_compute): a
            # wait shorter than the asleep rule's floor, which could never be judged asleep
            # itself, is folded back into the spell it interrupted; only a longer one starts a
            # new compute spell after it. Splitting every step's spell, a rank that stopped
            # before its allreduce lost the blame to a peer waiting in it: the drill's
            # collective hang, 1 run in 3 beside two CPU hogs.)
            compute_since, waits = self.liveness.since, self.step_slots.may_wait(manager)
            if waits:
                self.liveness.enter(Phase.SYNC)
            slots = self.step_slots.slots(manager, training)
            if waits and time.time() - self.liveness.since < self.cfg.ft.asleep_s:
                self.liveness.enter(Phase.COMPUTE, since=compute_since)
            else:
                self.liveness.enter(Phase.COMPUTE)
            for slot in slots[1:]:
                losses.append(self._forward_backward(self.batches.batch(step, slot, spec.rank)))
            loss = torch.stack([x.detach() for x in losses]).mean() if losses else None
            self.fault_agent.before_allreduce(self.ft)
            outlier = self._check_grads(step, max(1, len(slots))) if training else None
            self.liveness.enter(Phase.SYNC)
            summed = self.sync.sync_grads(veto=outlier is not None, micro_batches=len(slots), finish=self._finish_read)
            members, vetoes, micro_batches = summed.members, summed.vetoes, summed.micro_batches
            # After the quorum a healed group's step is the peers' step. The members decided on
            # the finish their last quorum agreed; a group that healed in this step was not in it,
            # so it takes the step as they did: applied when any of them trained it.
            step = batch_index = manager.current_step()
            apply_update = step < last if spec.group in members else micro_batches > 0
            if summed.finish is not None and manager.errored() is None:
                self.stop_at.agree(summed.finish)  # in force from the next step (StopAt)
            if vetoes:
                # A group's own gradient failed its check: every group votes against this commit,
                # so the step is discarded everywhere and no group's weights take that average.
                manager.report_error(RuntimeError(f"step {step}: group(s) {vetoes} voted against the commit (gradient check)"))
            elif apply_update and self.step_slots.constant and micro_batches != self.cfg.ft.replica_groups:
                # The sum holds a slot twice or misses one (a group that read another quorum, or
                # one holding past a finish it read first): every group sees the same sum, so
                # every one votes this step down, and it is trained again with the next quorum.
                manager.report_error(
                    RuntimeError(f"step {step}: the groups summed {micro_batches} data slots, not {self.cfg.ft.replica_groups} (ft.global_batch=constant)")
                )
            if apply_update:
                allowed, job_step = self.floor.allows(step)
                if not allowed:
                    self._refuse_commit(step, job_step)
                torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0, foreach=True)
                committed = manager.should_commit()
            else:
                # Nothing trained (a hold past the finish, or a heal into it): no step past it.
                committed = manager.commit_nothing()
            self.liveness.enter(Phase.COMPUTE)
            if committed and apply_update:
                self.optimizers.step()
                self.lr_schedulers.step()
                if self._grad_norm is not None and not vetoes:
                    self.grad_guard.accept(self._grad_norm)
            if spec.group not in members:
                slots = ()  # the Manager sent zeros for it (it heals in this step): it consumed nothing
        if not apply_update:
            return
        elapsed = time.time() - start
        timings = self.sync.take_timings()
        # This group's own compute (forward, backward, optimizer): the straggler detector
        # compares it across groups (the wall step is shared by every group in HSDP).
        timings["compute_s"] = round(compute_seconds({"step_time_s": elapsed, **timings}), 6)
        extra = {}
        if committed and self.sync.hash_due(tr.state_hash_every):
            extra["state_hash"] = state_hash(self.sync.consistent_state(self.state_dict()))
        if self.grad_guard is not None and self._grad_norm is not None:
            extra["grad_norm"] = self._grad_norm
        if vetoes:
            extra["vetoed_by"] = vetoes
        if self.integrity.enabled and ((committed and self.integrity.due(self.sync.steps_done() // self.sync.window)) or (vetoes and not committed)):
            # The state every group of this quorum must hold: after a commit the new one; after a
            # vetoed step the one they all held before it (compared at once: who is corrupt?).
            fp = fingerprint(self.sync.consistent_state(self.state_dict()))
            extra["fingerprint"] = fp.record(self.sync.steps_done(), vetoed=not committed)
            extra["fingerprint_s"] = round(fp.seconds, 6)
        if sums is not None:
            extra["sync_sent_sum"], extra["sync_avg_sum"] = sums
        self.reporter.step(
            step=step,
            committed=committed,
            loss=float(loss.item()) if loss is not None else None,
            tokens_per_s=len(slots) * self.tokens_per_step / elapsed if elapsed > 0 else None,
            step_time_s=elapsed,
            quorum_size=manager.num_participants(),
            quorum_id=self.ft.quorum_id,
            participating_groups=members_field(members),
            lr=float(self.optimizer.param_groups[0]["lr"]),
            # The batch trained (None: none, e.g. a group that healed into a sync), whether a
            # cross-group sync ran on this step, and whether its state came from a peer.
            batch=batch_index,
            sync=synced,
            healed=healed,
            mode=self.sync.mode,
            # ft.global_batch: the data slots this group trained at this step (records.global_batch),
            # and the tokens the step (hsdp) or the sync (localsgd, diloco) trained over every group.
            slots=list(slots),
            global_tokens=step_tokens(micro_batches, spec.world_size, tr.batch_size, tr.seq_len),
            **timings,
            **extra,
        )
        if committed:
            self.train_state.step = self.sync.steps_done()
            last_step = self.train_state.step == last
            if self.cfg.checkpoint.enable and save_due(self.train_state.step, self.ckpt_cfg.interval, last_step):
                self.liveness.enter(Phase.SAVE)
                self.save_checkpoint(self.train_state.step, last_step)

    def train(self) -> None:
        """Step until the job's last step, then hold while the supervisor keeps the job open."""
        self.wait_start()
        while True:
            step = self.sync.position()
            self.lease.finish_if_ended(self.reporter.event, self.layout.stop_at_step, step, self.announced_done)
            self._finish_read = self.group_min(self.sync.align_stop(self.stop_at.steps()))
            last = self.stop_at.in_force(self._finish_read)  # what the last quorum agreed (StopAt)
            if step >= last:
                self.save_final(step, last)
                if not self.group_min(int(self.hold_step(step))):
                    break
            self.train_step(step, last)
        final = self.sync.consistent_state(self.state_dict())
        self.reporter.event(
            EventKind.RANK_FINISHED,
            step=self.sync.steps_done(),
            # Every step it committed was its quorum's (a finish read late ends past it).
            steps_trained=self.sync.steps_done(),
            state_hash=state_hash(final),
        )

    def _settle_after_freeze(self) -> None:
        settled = self.freeze.settle()
        if settled is not None:
            froze, waited = settled
            self.reporter.event(EventKind.RANK_FROZE, frozen_s=round(froze.frozen_s, 3), waited_s=round(waited, 3))

    def close(self) -> None:
        if getattr(self, "link_probe", None) is not None:
            self.link_probe.close()
        if getattr(self, "freeze", None) is not None:
            self.freeze.close()
        self.liveness.close()
        self.reporter.close()
        self.manager.shutdown(wait=False)
        self.checkpointer.close()
        dist.destroy_process_group()


def _on_this_node(spec: RankSpec, transport_interface: Optional[str]) -> RankSpec:
    """The spec with the group's store and the rank's advertised host on this node's address.

    The controller leaves them empty where the scheduler picks the node (launcher=slurm
    without launcher.options.nodes): only here is the node known. The address is the one
    ``ft.transport_interface``'s rule picks (monarch_ft.transport.interface: the configured
    interface, the RDMA port's, else the route to the Lighthouse), so the other nodes reach
    it; every rank of the group runs on this node, picks the same one, and finds rank 0's store.
    """
    from monarch_ft.transport.interface import resolve

    choice = resolve(transport_interface, spec.lighthouse_addr)
    logging.getLogger(__name__).info("group store and advertised host on %s (%s) because: %s", choice.address, choice.interface, choice.why)
    return dataclasses.replace(spec, store_host=choice.address, advertise_host=choice.address)


def train(spec: RankSpec) -> None:
    """Run one rank to the end of the job (monarch_ft.rank.worker's entry point, and a Monarch
    actor's). An exception that ends it is reported first (Trainer.reporting_errors)."""
    trainer = Trainer(spec)
    with trainer.reporting_errors():
        trainer.train()
    trainer.close()
