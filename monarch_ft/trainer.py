"""The per-rank training loop: TorchTitan's model, optimizer, LR schedule and
checkpointing, with a TorchFT Manager across replica groups.

Why a thin trainer of our own rather than ``torchtitan.train``: TorchTitan 0.2.x's
trainer assumes an accelerator (``cuda`` device fallback, ``barrier(device_ids=...)``
that gloo rejects), so on CPU we reuse its components directly and keep the loop
small. The same loop runs NCCL + CUDA when a GPU is present (monarch_ft/devices.py:
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

import dataclasses
import faulthandler
import hashlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from monarch_ft.components.checkpoint import SaveWatchdog, TrainState, build_checkpointer, save_due
from monarch_ft.components.fault_agent import FaultAgent
from monarch_ft.components.lease import ControllerLease
from monarch_ft.components.ft import CommitFloor, build_manager, load_in_place, to_local_tree
from monarch_ft.components.sync import build_sync, checkpoint_interval, uses_async_quorum
from monarch_ft.components.metrics import Liveness, RankReporter
from monarch_ft.components.model import build_model
from monarch_ft.config import JobConfig
from monarch_ft.data import TokenBatches
from monarch_ft.devices import cross_group_backend, cuda_index, device_type, set_nccl_hostid
from monarch_ft.launcher.base import RankExit
from monarch_ft.recovery import Phase, StateSource
from monarch_ft.run_layout import RunLayout, read_json


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
    # Checkpoint step to load before reporting model_ready: -1 the latest, None nothing.
    load_step: Optional[int] = None
    scratch_dir: str = ""
    # A file the rank waits for before its first step ("" for none): a shared start gate
    # (Supervisor._open_start_gate) or the group's own launch gate, whose JSON content says
    # where its state comes from (Supervisor._open_launch_gates).
    start_gate: str = ""


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
    """``training.steps``, or an earlier step the supervisor asks every group to stop at
    (a file it writes once); every group reads the same number, so they stop together."""

    def __init__(self, path: str, steps: int) -> None:
        self.path, self.default = path, steps
        self._value = steps

    def steps(self) -> int:
        if self._value == self.default and os.path.exists(self.path):
            with open(self.path) as f:
                text = f.read().strip()
            if text:
                self._value = min(self.default, int(text))
        return self._value


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


def train(spec: RankSpec) -> None:
    cfg = _config(spec)
    tr = cfg.training
    torch.set_num_threads(tr.threads_per_rank)
    layout = RunLayout(spec.run_dir, cfg.checkpoint.folder)
    reporter = RankReporter(spec.report_path, spec.group, spec.rank, spec.attempt)
    reporter.event("rank_started")
    liveness = Liveness(reporter)
    # Stacks on demand (the supervisor's fallback when py-spy cannot read this process).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    if spec.scratch_dir:
        # Host-local scratch: what a node fault takes away with the host.
        os.makedirs(spec.scratch_dir, exist_ok=True)
        with open(os.path.join(spec.scratch_dir, "rank.json"), "w") as f:
            f.write(f'{{"pid": {os.getpid()}, "attempt": {spec.attempt}}}\n')

    use_cuda = device_type(tr.device) == "cuda"
    if tr.device == "cuda" and not use_cuda:
        raise RuntimeError(f"training.device=cuda but torch sees no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})")
    xgroup_backend = cross_group_backend(cfg.ft.cross_group_backend, "cuda" if use_cuda else "cpu")
    device = torch.device("cpu")
    nccl_hostid = None
    if use_cuda:
        device = torch.device("cuda", cuda_index(spec.group, spec.rank, spec.world_size, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        if cfg.ft.nccl_hostid_per_group:
            # Before the first NCCL communicator of this process: NCCL reads it then.
            nccl_hostid = set_nccl_hostid(spec.group)

    # The group's own store: rank 0 hosts it (a fresh port per launch attempt), the
    # in-group process group and the TorchFT Manager are its clients.
    store = dist.TCPStore(
        spec.store_host,
        spec.store_port,
        world_size=spec.world_size,
        is_master=spec.rank == 0,
        timeout=timedelta(seconds=cfg.ft.connect_timeout_s * 3),
        wait_for_workers=False,
    )
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        store=dist.PrefixStore("group", store),
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

    model = build_model(cfg.model, tr.seq_len, mesh, device, tr.seed)
    optimizers = OptimizersContainer(
        [model],
        torch.optim.AdamW,
        {"lr": tr.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": tr.weight_decay, "foreach": True},
    )
    optimizer = optimizers.optimizers[0]
    # Materialise the optimizer state now (a zero-lr step, as torch's own state-dict
    # loader does) so a healing group can receive into it in place.
    _init_optim_state(optimizer)
    lr_schedulers = build_lr_schedulers(optimizers, LRScheduler(warmup_steps=tr.warmup_steps), tr.steps)

    # Captured once: FSDP2 keeps these sharded parameter objects for the whole run.
    # model.state_dict() must not be called from the Manager's quorum thread while the
    # main thread runs forward (FSDP2 swaps registered params around forward/backward).
    params = dict(model.named_parameters())

    def ft_state_dict() -> dict:
        return {
            "model": {name: p.to_local() if hasattr(p, "to_local") else p for name, p in params.items()},
            "optim": {name: to_local_tree(optimizer.state[p]) for name, p in params.items()},
            "lr_scheduler": lr_schedulers.state_dict(),
        }

    def ft_load_state_dict(state: dict) -> None:
        live = ft_state_dict()
        load_in_place(live["model"], state["model"], "model")
        load_in_place(live["optim"], state["optim"], "optim")
        lr_schedulers.load_state_dict(state["lr_scheduler"])
        apply_scheduler_lr(lr_schedulers)

    manager = build_manager(
        cfg.ft,
        group=spec.group,
        rank=spec.rank,
        world_size=spec.world_size,
        store_addr=spec.store_host,
        store_port=spec.store_port,
        lighthouse_addr=spec.lighthouse_addr,
        hostname=spec.advertise_host,
        state_dict=ft_state_dict,
        load_state_dict=ft_load_state_dict,
        report=reporter.event,
        backend=xgroup_backend,
        use_async_quorum=uses_async_quorum(cfg.ft),
        lighthouse_epoch_path=layout.lighthouse_epoch,
    )
    floor = CommitFloor(layout.commit_floor)

    def refuse_commit(step: int, job_step: int) -> None:
        # Never commit below the job's step (see CommitFloor): vote against this commit, and
        # give up once it is clear that nobody in the quorum can heal this group.
        reporter.event("commit_refused", step=step, job_step=job_step, refusals=floor.refusals)
        if floor.refusals >= floor.MAX_REFUSALS:
            reporter.close()
            os._exit(int(RankExit.COMMIT_BELOW_FLOOR))
        manager.report_error(RuntimeError(f"step {step} is below the job's committed step {job_step}"))

    # ft.mode: how groups synchronise (monarch_ft/components/sync.py).
    sync = build_sync(cfg.ft, manager, model, optimizer, lr_schedulers, params, spec.group, floor, refuse_commit)
    # localsgd/diloco write checkpoints at sync points only.
    ckpt_cfg = dataclasses.replace(cfg.checkpoint, interval=checkpoint_interval(cfg.ft, cfg.checkpoint.interval))
    train_state = TrainState()
    checkpointer = build_checkpointer(
        ckpt_cfg,
        spec.run_dir,
        spec.group,
        model,
        optimizers,
        lr_schedulers,
        {"train_state": train_state, "ft_manager": manager},
        tr.seed,
    )
    loaded_step: Optional[int] = None

    def load_checkpoint(step: int) -> None:
        nonlocal loaded_step
        loaded = checkpointer.load(step=step)
        apply_scheduler_lr(lr_schedulers)
        loaded_step = manager.current_step() if loaded else None
        if loaded:
            sync.after_checkpoint_load()
        reporter.event("checkpoint_loaded" if loaded else "checkpoint_missing", step=manager.current_step())

    if cfg.checkpoint.enable and spec.load_step is not None:
        load_checkpoint(spec.load_step)

    batches = TokenBatches(spec.tokens_path, tr.batch_size, tr.seq_len, tr.seed)
    fault_agent = FaultAgent(layout, spec.group, spec.rank, reporter.event)
    save_watchdog = SaveWatchdog(
        cfg.checkpoint.save_timeout_s,
        reporter.event,
        os.path.join(layout.stacks_dir, f"save-timeout-{layout.tag(spec.group, spec.rank, spec.attempt)}.txt"),
    )
    reporter.event(
        "model_ready",
        step=manager.current_step(),
        params=sum(p.numel() for p in model.parameters()),
        transport_metadata=manager.checkpoint_metadata(),
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if use_cuda else None,
        group_backend=dist.get_backend(),
        cross_group_backend=xgroup_backend,
        nccl_version=".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None,
        nccl_hostid=nccl_hostid,
    )

    # The job's first launch (and each full restart) starts training together: a group
    # ready early would otherwise train alone and make the others heal from it.
    liveness.enter(Phase.GATE)
    # No controller for controller.lease_s (or an unanswered stop): the job ends itself.
    lease = ControllerLease(layout.controller_heartbeat, layout.stop_request, cfg.controller.lease_s, cfg.controller.heartbeat_s)
    while spec.start_gate and not os.path.exists(spec.start_gate):
        lease.exit_at_gate(reporter.event, manager.current_step())
        reporter.heartbeat(step=manager.current_step(), waiting="start")
        time.sleep(0.05)
    # A relaunched group's gate says where its state comes from, decided when it is ready
    # (the peers alive at its launch may be gone): a live peer heals it in the quorum; with
    # none left, the newest checkpoint (aligned into this group's folder by the supervisor).
    decision = read_json(spec.start_gate, {}) if spec.start_gate else {}
    if decision.get("source") == StateSource.DISK.value and loaded_step != decision["step"]:
        load_checkpoint(int(decision["step"]))
    # localsgd/diloco: heal at the peers' next sync point before training anything.
    sync.join_pending = sync.semi_sync and decision.get("source") == StateSource.PEER.value

    tokens_per_step = tr.batch_size * tr.seq_len

    def forward_backward(batch) -> torch.Tensor:
        inputs, labels = batch
        logits = model(inputs.to(device))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.to(device).flatten())
        loss.backward()
        return loss

    announced_done = False
    last_heartbeat = 0.0
    stop_at = StopAt(layout.stop_at_step, tr.steps)
    while True:
        step = sync.position()
        lease.finish_if_ended(reporter.event, layout.stop_at_step, step, announced_done)
        last = sync.align_stop(stop_at.steps())
        training = step < last
        if not training:
            liveness.enter(Phase.HOLD)
            if not announced_done:
                reporter.event("train_done", step=step)
                announced_done = True
            if not os.path.exists(spec.hold_path) or lease.ended():
                break
            if time.time() - last_heartbeat > 1.0:
                reporter.heartbeat(step=step)
                last_heartbeat = time.time()
            time.sleep(0.1)
        start = time.time()
        healed, batch_index, synced = False, step, True
        if sync.semi_sync:
            res = sync.step(
                training,
                last,
                lambda pos: forward_backward(batches.batch(pos, spec.group, spec.rank)),
                lambda: torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0, foreach=True),
                lambda: fault_agent.before_allreduce(manager),
                lambda phase: liveness.enter(phase, fresh=True),
            )
            apply_update = res is not None
            if res is not None:
                step, committed, loss, members = res.step, res.committed, res.loss, res.members
                healed, batch_index, synced = res.healed, res.batch, res.synced
        else:
            liveness.enter(Phase.SYNC)  # waits for the previous step's quorum, if still running
            manager.start_quorum()
            liveness.enter(Phase.COMPUTE)
            optimizers.zero_grad()
            loss = None
            if training:
                loss = forward_backward(batches.batch(step, spec.group, spec.rank))
            fault_agent.before_allreduce(manager)
            liveness.enter(Phase.SYNC)
            members = sync.sync_grads()
            # After the quorum a healed group's step is the peers' step; decide on that.
            step = batch_index = manager.current_step()
            apply_update = step < last
            if apply_update:
                allowed, job_step = floor.allows(step)
                if not allowed:
                    refuse_commit(step, job_step)
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0, foreach=True)
            committed = manager.should_commit()
            liveness.enter(Phase.COMPUTE)
            if committed and apply_update:
                optimizers.step()
                lr_schedulers.step()
        if not apply_update:
            continue
        elapsed = time.time() - start
        extra = {}
        if committed and sync.hash_due(tr.state_hash_every):
            extra["state_hash"] = state_hash(sync.consistent_state(ft_state_dict()))
        reporter.step(
            step=step,
            committed=committed,
            loss=float(loss.item()) if loss is not None else None,
            tokens_per_s=tokens_per_step / elapsed if elapsed > 0 else None,
            step_time_s=elapsed,
            quorum_size=manager.num_participants(),
            quorum_id=manager.quorum_id,
            participating_groups=members,
            lr=float(optimizer.param_groups[0]["lr"]),
            # The batch trained (None: none, e.g. a group that healed into a sync), whether a
            # cross-group sync ran on this step, and whether its state came from a peer.
            batch=batch_index,
            sync=synced,
            healed=healed,
            mode=sync.mode,
            **sync.take_timings(),
            **extra,
        )
        if committed:
            train_state.step = sync.steps_done()
            last_step = train_state.step == last
            if cfg.checkpoint.enable and save_due(train_state.step, ckpt_cfg.interval, last_step):
                liveness.enter(Phase.SAVE)
                with save_watchdog.guard(train_state.step):
                    fault_agent.during_save()
                    checkpointer.save(train_state.step, last_step=last_step)

    final = sync.consistent_state(ft_state_dict())
    reporter.event(
        "rank_finished",
        step=sync.steps_done(),
        steps_trained=min(sync.steps_done(), sync.align_stop(stop_at.steps())),
        state_hash=state_hash(final),
    )
    liveness.close()
    reporter.close()
    manager.shutdown(wait=False)
    checkpointer.close()
    dist.destroy_process_group()
