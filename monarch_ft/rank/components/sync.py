"""How replica groups synchronise, one strategy per ``ft.mode``.

* ``hsdp``: every step the local grad shards are averaged across groups (GradSync, one
  flat allreduce) and every group takes the same optimizer step. The trainer's own loop
  body runs it; this module only supplies its position and what must be equal.
* ``localsgd`` / ``diloco``: semi-synchronous. Each group takes ``window`` inner steps
  alone, then syncs: torchft's own ``LocalSGD`` (parameters averaged) or ``DiLoCo``
  (pseudo-gradients averaged, applied by an outer optimizer; streaming DiLoCo with
  fragments). torchft's classes hook the inner optimizer's ``step`` and run the quorum,
  the collectives and ``should_commit`` inside it; we drive them, we do not re-implement
  them. The Manager's step then counts syncs, not inner steps.

Units, the same in every mode: a *step* is one inner step (one batch per rank). The step
record's ``step`` is the inner step a batch was trained at; ``committed`` is True only on
the record of a sync that committed (hsdp: every committed step), so the supervisor's job
step, the commit floor, StopAt and checkpoint steps all count inner steps. In
localsgd/diloco ``position = manager_step * window + local_step``, and checkpoints are
written at sync points only.

Recovery: a relaunched group that heals from a live peer (``join``) blocks in a quorum
before training anything, heals everything the mode holds at the peers' sync point (model,
inner optimizer, LR schedule, and through torchft's own registered state: DiLoCo's last
global copy and outer optimizers) and takes part in that sync, so it leaves it at the
peers' position with ``local_step`` 0: in step and at the same batch. Its heal happens in
the synchronous quorum, so what it would send into that sync is its donor's window (torchft
counts it: "some replicas will get the same copy of the model"); it sends zeros instead and the
average divides by the groups that trained a window (MonarchManager.count_healing), so each
window counts once, with any number of groups. The step record of a sync carries the sums this
rank sent into its averages and got out of them (``sync_sent_sum``, ``sync_avg_sum``), which
make that checkable from the records.

A group that finished holds the job open for a restarted peer by serving quorums; those
quorums commit nothing, and leave its step at the finish (MonarchManager.commit_nothing).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.distributed import ReduceOp

from monarch_ft.config.ft import FTConfig
from monarch_ft.rank.components.ft import CommitFloor, GradSync, Membership, MonarchManager, Synced, SyncTrace, to_local_tree
from monarch_ft.rank.components.torchft_compat import diloco_global_copies, diloco_save_global, diloco_sync_in_quorum, local_step, localsgd_sync_in_quorum


@dataclass
class StepResult:
    """What one pass of the loop did, for the step record."""

    step: int  # the inner step this record stands for
    committed: bool  # a sync that committed (hsdp: the step committed)
    synced: bool  # a cross-group sync was attempted on this step
    loss: Optional[torch.Tensor]
    members: List[int] = field(default_factory=list)  # groups counted in the sync
    healed: bool = False  # this window's state came from a peer, not from its own batches
    batch: Optional[int] = None  # the batch index trained (None: none, e.g. a join)
    # The sums this rank sent into the sync's averages and got out of them (MonarchManager.sync_trace).
    sums: Optional[Tuple[float, float]] = None


def window_of(cfg: FTConfig) -> int:
    """Inner steps per Manager step: 1 (hsdp), H (localsgd, diloco), H / fragments (streaming)."""
    if cfg.mode == "hsdp":
        return 1
    return cfg.sync_every // cfg.fragments


def uses_async_quorum(cfg: FTConfig) -> bool:
    """hsdp overlaps the quorum with compute; DiLoCo requires a synchronous quorum, and
    localsgd uses one too so a healed group is whole before its first collective."""
    return cfg.mode == "hsdp"


def checkpoint_interval(cfg: FTConfig, interval: int) -> int:
    """Checkpoints are written at sync points only: ``interval`` rounded up to a whole
    number of windows (TorchTitan saves at steps that are multiples of it)."""
    w = window_of(cfg)
    return max(1, math.ceil(interval / w)) * w


def model_fragments(model: nn.Module, n: int) -> List[nn.Module]:
    """Split a TorchTitan decoder into ``n`` contiguous fragments for streaming DiLoCo.

    The transformer blocks are cut into ``n`` runs of about equal parameter count; the
    embedding goes with the first, the final norm and output head with the last. Every
    parameter is in exactly one fragment, and the split depends only on the model, so
    every group cuts it the same way (the fragments are synced by index)."""
    if n == 1:
        return [model]
    children = list(model.named_children())
    blocks = [m for name, m in children if name == "layers"]
    layers = list(blocks[0].children()) if blocks else []
    if len(layers) < n:
        raise ValueError(f"ft.fragments={n}: the model has only {len(layers)} transformer blocks")
    per = math.ceil(len(layers) / n)
    chunks = [nn.ModuleList(layers[i * per : (i + 1) * per]) for i in range(n)]
    for name, m in children:
        if name != "layers":
            (chunks[0] if name == "tok_embeddings" else chunks[-1]).append(m)
    return chunks


class SyncStrategy(ABC):
    """One mode's synchronisation across replica groups, called by the trainer at fixed points.

    Args:
        manager: the rank's MonarchManager.
        model, optimizer, lr_schedulers, params: the group's model (FSDP2), inner optimizer,
            TorchTitan LR schedulers and its named parameters (captured once).
        cfg: the ``ft`` config.
        group: this replica group's index.
    """

    mode = ""
    semi_sync = False

    def __init__(self, manager: MonarchManager, model: nn.Module, optimizer, lr_schedulers, params: Dict[str, nn.Parameter], cfg: FTConfig, group: int) -> None:
        self.manager, self.model, self.optimizer, self.lr_schedulers = manager, model, optimizer, lr_schedulers
        self.params, self.cfg, self.group = params, cfg, group
        self.window = window_of(cfg)

    def position(self) -> int:
        """The inner step the next batch is trained at."""
        return self.manager.current_step() * self.window

    def steps_done(self) -> int:
        """Inner steps committed by the job as this group knows it (the checkpoint step)."""
        return self.manager.current_step() * self.window

    def align_stop(self, steps: int) -> int:
        """A stop step the mode can end at: a sync point (the last window is averaged)."""
        return math.ceil(steps / self.window) * self.window

    def hash_due(self, every: int) -> bool:
        """Whether this committed step's state hash goes into the step record."""
        return bool(every) and self.steps_done() % every == 0

    @abstractmethod
    def consistent_state(self, ft_state: Dict[str, Any]) -> Dict[str, Any]:
        """The part of the state that must be bit-identical across groups at a sync point."""

    def checkpoint_states(self) -> Dict[str, Any]:
        """What a disk checkpoint holds for this mode beside the model, the inner optimizer and
        the LR schedule (TorchTitan ``states``: name -> Stateful)."""
        return {}

    def after_checkpoint_load(self) -> None:
        """The disk checkpoint replaced the weights (a checkpoint is always a sync point)."""

    def take_timings(self) -> Dict[str, float]:
        """Seconds of the last step in quorum (and commit vote) and in the cross-group sync."""
        s = self.manager.take_seconds()
        return {"quorum_s": s["quorum"] + s["commit"], "xgroup_s": 0.0}


class HSDPSync(SyncStrategy):
    """Per-step gradient averaging; the trainer's loop body drives it (``sync_grads``)."""

    mode = "hsdp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.grad_sync = GradSync([p for p in self.model.parameters() if p.requires_grad], self.cfg.replica_groups, self.group)
        self._xgroup = 0.0

    def sync_grads(self, veto: bool = False, micro_batches: int = 1, finish: Optional[int] = None) -> Synced:
        """Average the grad shards across groups (``veto``: this rank's gradient failed its
        check, see GradSync; ``micro_batches``: how many it sums; ``finish``: the finish step
        this group read); returns what GradSync learned (the groups counted, those that vetoed,
        the micro-batches summed, the lowest finish read)."""
        quorum_before = self.manager.seconds["quorum"]
        start = time.perf_counter()
        synced = self.grad_sync.sync(self.manager, veto, micro_batches, finish)
        # The async quorum is waited for inside the allreduce: that part is quorum time.
        self._xgroup += time.perf_counter() - start - (self.manager.seconds["quorum"] - quorum_before)
        return synced

    def take_timings(self) -> Dict[str, float]:
        out = super().take_timings()
        out["xgroup_s"], self._xgroup = self._xgroup, 0.0
        return out

    def consistent_state(self, ft_state: Dict[str, Any]) -> Dict[str, Any]:
        # Every group takes every step: model and optimizer state are equal after each.
        return {k: v for k, v in ft_state.items() if k != "lr_scheduler"}


class SemiSync(SyncStrategy):
    """What localsgd and diloco share: the inner-step loop around torchft's class, the
    join of a healed group, the hold quorum, membership and the commit floor."""

    semi_sync = True

    def __init__(self, *args: Any, floor: CommitFloor, refuse: Callable[[int, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.floor, self.refuse = floor, refuse
        self.join_pending = False
        self._window_trained = False
        self._members: List[int] = []
        self._window_heals = self.manager.heals
        self._xgroup = 0.0
        self._sums: Optional[Tuple[float, float]] = None
        # The finish this group read (set by the trainer each step), offered at the next sync,
        # and the lowest one the sync's groups offered.
        self.finish_offer: Optional[int] = None
        self._agreed_finish: Optional[int] = None
        # Whether this group holds in the current quorum (it serves it, trains nothing), the
        # quorum whose membership it has exchanged, and whether a peer holds in that one: a sync
        # that meets holders is served as they serve it (MonarchManager.past_finish).
        self._holding = False
        self._exchanged = -1
        self._peers_hold = False
        self.manager.past_finish = self._peers_holding
        # A group that heals at a sync brings its donor's window: it sends zeros, and the average
        # divides by the groups that trained one (MonarchManager.count_healing).
        self.manager.count_healing = False
        self.manager.sync_trace = SyncTrace()
        self.impl = self._build()
        self.impl.__enter__()  # registers torchft's optimizer hooks for the whole run
        self.manager.before_commit = self._before_commit

    @abstractmethod
    def _build(self) -> Any:
        """torchft's LocalSGD or DiLoCo over this group's model and inner optimizer."""

    @abstractmethod
    def _sync_now(self) -> None:
        """The sync half of torchft's step hook, after a quorum the caller started (join)."""

    def local_step(self) -> int:
        # torchft's own counter is the authority on where the window is.
        return local_step(self.impl)

    def position(self) -> int:
        return self.manager.current_step() * self.window + self.local_step()

    def hash_due(self, every: int) -> bool:
        # Groups differ between syncs; every committed sync is a point where they must agree.
        return bool(every)

    def _before_commit(self) -> None:
        """Inside should_commit, after the sync's collectives: what they summed, who took part
        (exchanged before the first of them, or here when there was none), and the floor."""
        self._sums = self.manager.sync_trace.take()
        self._exchange()
        if self._window_trained:
            step = (self.manager.current_step() + 1) * self.window - 1
            allowed, job_step = self.floor.allows(step)
            if not allowed:
                self.refuse(step, job_step)

    def _peers_holding(self) -> bool:
        """MonarchManager.past_finish: does a peer of this quorum hold at the finish while this
        group came to sync? Then the sync's averages must not run (the holders run none)."""
        self._exchange()
        return self._peers_hold and not self._holding

    def _exchange(self) -> None:
        """The quorum's first collective, once per quorum, on every group of it
        (:class:`Membership`): the groups counted in the sync's averages (a group healing in it
        sends zeros), the groups holding at the finish, and the lowest finish they read
        (:attr:`finish_offer`; rank.trainer.StopAt): what every group of the sync decides its
        next window on, a healing one too.

        Why first: a group that holds at the finish runs no average, only its commit vote, so
        a straggler that heals to the holders' step must know they hold before its first
        average, or gloo meets an average against the holders' collective and aborts a holder
        ("Received data size doesn't match expected size"). Deciding that on the finish the
        straggler had agreed was not enough: it had agreed its last sync before the finish was
        written, the peers read it in the window after and agreed it at a sync it missed (CI at
        abeb6af, localsgd; replayed in test_sync_modes_jobs). The holders say they hold here,
        in the exchange both sides run before anything else."""
        if self._exchanged == self.manager.quorums:
            return
        self._exchanged = self.manager.quorums
        self._peers_hold = False  # the exchange's own allreduce runs as any collective does
        n = self.cfg.replica_groups
        summed = Membership.slots(n, self.group, self.finish_offer, self._holding)
        trace, self.manager.sync_trace = self.manager.sync_trace, None  # not one of the sync's averages
        try:
            self.manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        finally:
            self.manager.sync_trace = trace
        seen = Membership.read(summed.tolist(), n)
        self._members = seen.members
        if self.manager.errored() is None:  # a failed exchange's sums are this group's own
            self._agreed_finish = seen.finish
            self._peers_hold = seen.peers_hold(self.group)

    def take_agreed_finish(self) -> Optional[int]:
        """The finish the last sync agreed on, once (None: no sync since, or none offered)."""
        agreed, self._agreed_finish = self._agreed_finish, None
        return agreed

    def _set_lr(self, position: int) -> None:
        """The LR of inner step ``position``, a function of the position alone, so a window
        discarded by a failed sync, or a heal, leaves the schedule where the batches are."""
        for scheduler in self.lr_schedulers.schedulers:
            scheduler.last_epoch = position - 1
            scheduler.step()

    def _hold(self) -> None:
        """Done training, held open for a restarted group: serve quorums (it heals in one),
        commit nothing new to the weights, and no step past the finish."""
        self._window_trained = False
        self._holding = True
        self.manager.start_quorum()
        self.manager.commit_nothing()

    def _join(self) -> Optional[StepResult]:
        """A relaunched group: heal at the peers' next sync point, then take part in it, or,
        when they hold at the finish, serve their quorum as they do (None: nothing trained).

        Which of the two, the quorum's exchange says (MonarchManager.past_finish), not this
        group's own first read of the finish: the peers decide on the finish they agreed, and a
        read that differs from it (a finish written while this group joins) would make one side
        average while the other holds, the collective mismatch that aborts a holder."""
        self._window_trained = False
        heals = self.manager.heals
        # The peers reach their sync point within one window; allow that on a slow machine.
        self.manager.start_quorum(timeout=timedelta(seconds=max(self.cfg.quorum_timeout_s, self.cfg.startup_timeout_s)))
        before = self.manager.current_step()
        start = time.perf_counter()
        self._sync_now()
        self._xgroup += time.perf_counter() - start
        if self.manager.take_served_past_finish():
            self._take_sums()
            return None
        committed = self.manager.current_step() > before
        if not committed and self.manager.heals == heals:
            # Its quorum failed before it healed (a peer died after asking for that quorum, was
            # made a member, and the others waited ft.timeout_s for it). It has no state of its own to
            # train a window on: join again at the peers' next sync. Before, it trained a window
            # from its initial weights, healed at that window's sync and recorded the sync as
            # its own step 9, below the job's 39 (status regressed; a stress run at 56fef4b).
            self.join_pending = True
        self._window_heals = self.manager.heals
        return StepResult(
            step=(before + 1) * self.window - 1,
            committed=committed,
            synced=True,
            loss=None,
            members=self._members,
            healed=self.manager.heals != heals,
            sums=self._take_sums(),
        )

    def step(
        self,
        training: bool,
        last: int,
        forward_backward: Callable[[int], torch.Tensor],
        clip: Callable[[], None],
        before_sync: Callable[[], None],
        phase: Callable[[str], None],
    ) -> Optional[StepResult]:
        """One inner step (and the sync at the window's end); None when nothing was trained."""
        self._holding = False
        if self.join_pending:
            self.join_pending = False
            phase("sync")
            return self._join()
        if not training:
            self._hold()
            return None
        pos, local = self.position(), self.local_step()
        if local == 0:
            self._window_heals = self.manager.heals
        self._set_lr(pos)
        self.optimizer.zero_grad()
        phase("compute")
        loss = forward_backward(pos)
        clip()
        synced = local + 1 == self.window
        before = self.manager.current_step()
        self._window_trained = True
        if synced:
            before_sync()
            phase("sync")
        start = time.perf_counter()
        self.optimizer.step()  # torchft's post-hook runs the sync at the window's end
        if synced:
            self._xgroup += time.perf_counter() - start
        # Healed to the finish in a sync it missed (MonarchManager.past_finish): its window is
        # the peers' now, and nothing of it was committed.
        served = self.manager.take_served_past_finish()
        committed = synced and self.manager.current_step() > before and not served
        return StepResult(
            # A committed sync is the sync point it reached: this window's end, or, when this
            # group healed in it (it fell behind its peers by syncs it missed), theirs.
            step=self.manager.current_step() * self.window - 1 if committed else pos,
            committed=committed,
            synced=synced,
            loss=loss,
            members=self._members if synced else [],
            healed=synced and self.manager.heals != self._window_heals,
            batch=pos,
            sums=self._take_sums() if synced else None,
        )

    def _take_sums(self) -> Optional[Tuple[float, float]]:
        sums, self._sums = self._sums, None
        return sums

    def take_timings(self) -> Dict[str, float]:
        out = super().take_timings()
        # The sync's wall time includes its quorum and commit vote: count those there.
        out["xgroup_s"], self._xgroup = max(0.0, self._xgroup - out["quorum_s"]), 0.0
        return out


class LocalSGDSync(SemiSync):
    """torchft.local_sgd.LocalSGD: parameters averaged every ``sync_every`` steps.

    Inner optimizer state stays per group (it is never averaged), so what must agree at a
    sync point is the model alone."""

    mode = "localsgd"

    def _build(self) -> Any:
        from torchft.local_sgd import LocalSGD

        return LocalSGD(self.manager, self.model, self.optimizer, sync_every=self.window)

    def _sync_now(self) -> None:
        localsgd_sync_in_quorum(self.impl)

    def consistent_state(self, ft_state: Dict[str, Any]) -> Dict[str, Any]:
        return {"model": ft_state["model"]}


class DiLoCoSync(SemiSync):
    """torchft.local_sgd.DiLoCo: pseudo-gradients averaged, applied by an outer optimizer.

    torchft registers each fragment's last global copy and outer optimizer with the Manager,
    so a heal carries them next to our model/inner-optimizer state. Between syncs the
    groups' weights differ; the global copies and outer optimizers must agree."""

    mode = "diloco"

    def _build(self) -> Any:
        from torchft.local_sgd import DiLoCo

        fragments = model_fragments(self.model, self.cfg.fragments)
        self.outer = [
            torch.optim.SGD(
                f.parameters(), lr=self.cfg.outer_lr, momentum=self.cfg.outer_momentum, nesterov=self.cfg.outer_nesterov and self.cfg.outer_momentum > 0
            )
            for f in fragments
        ]
        for opt in self.outer:
            opt.register_load_state_dict_post_hook(_state_as_params)
            _materialise_momentum(opt)
        self.fragments = fragments
        return DiLoCo(self.manager, fragments, self.optimizer, self.outer, sync_every=self.cfg.sync_every)

    def _sync_now(self) -> None:
        diloco_sync_in_quorum(self.impl)

    def checkpoint_states(self) -> Dict[str, Any]:
        state = DiLoCoDiskState(self.outer, self.fragments, diloco_global_copies(self.impl) if len(self.fragments) > 1 else None)
        return {"diloco": state} if state.state_dict() else {}

    def after_checkpoint_load(self) -> None:
        # Plain DiLoCo's checkpoint is written at a sync point: its weights are the global copy.
        # Streaming DiLoCo's weights are so for the fragment just synced only: its checkpoint
        # holds every fragment's global copy (DiLoCoDiskState), loaded as they were.
        if len(self.fragments) == 1:
            diloco_save_global(self.impl)

    def consistent_state(self, ft_state: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "global": diloco_global_copies(self.impl),
            "outer": [to_local_tree(opt.state_dict()) for opt in self.outer],
        }


def _materialise_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Give an outer SGD its momentum buffers now, as zeros, instead of at its first step.

    A disk checkpoint needs the tensors to load into (DCP loads in place), and every group must
    hold the same state from the start (the state hash covers it). SGD's first step with a zero
    buffer gives what it gives without one: ``0 * momentum + grad`` is ``grad``."""
    for group in optimizer.param_groups:
        if not group["momentum"]:
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p.detach())


class DiLoCoDiskState:
    """What a DiLoCo disk checkpoint holds beside the model and the inner optimizer: each
    fragment's outer momentum and, with streaming fragments, its last global copy.

    A live heal already carries both (torchft registers them with the Manager); without them
    on disk a resume restarted the outer momentum from zero and took its next outer step
    unlike an uninterrupted run. Tensors are saved as the parameters are laid out (DTensors
    under FSDP: DCP then writes each rank's shard once), keyed by fragment and parameter name.

    Args:
        outer: the outer optimizers, one per fragment.
        fragments: the model fragments they step.
        global_copies: each fragment's global copy (name -> this rank's shard), or None when
            the weights of a checkpoint are the global copy (one fragment).
    """

    def __init__(self, outer: List[torch.optim.Optimizer], fragments: List[nn.Module], global_copies: Optional[List[Dict[str, torch.Tensor]]]) -> None:
        self.outer, self.fragments, self.global_copies = outer, fragments, global_copies

    def _params(self, i: int) -> List[Tuple[str, nn.Parameter]]:
        return list(self.fragments[i].named_parameters())

    def state_dict(self) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        for i, opt in enumerate(self.outer):
            for name, p in self._params(i):
                buf = opt.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    out[f"fragment_{i}.momentum.{name}"] = buf
                if self.global_copies is not None:
                    out[f"fragment_{i}.global.{name}"] = _like_param(self.global_copies[i][name], p)
        return out

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for i, opt in enumerate(self.outer):
                for name, p in self._params(i):
                    buf = state.get(f"fragment_{i}.momentum.{name}")
                    if buf is not None:
                        mine = opt.state[p].get("momentum_buffer")
                        if mine is None:
                            opt.state[p]["momentum_buffer"] = buf
                        elif mine is not buf:
                            mine.copy_(buf)
                    saved = state.get(f"fragment_{i}.global.{name}")
                    if saved is not None and self.global_copies is not None:
                        local = saved.to_local() if isinstance(saved, DTensor) else saved
                        self.global_copies[i][name].copy_(local)


def _like_param(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's shard) laid out as parameter ``p`` (a DTensor over the same storage under FSDP)."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(), run_check=False)
    return local


def _state_as_params(optimizer: torch.optim.Optimizer) -> None:
    """A healed outer optimizer's state arrives as local shards (the transport ships each
    rank's own shard); FSDP2's parameters are DTensors, so wrap each like its parameter."""
    from torch.distributed.tensor import DTensor

    for p, state in optimizer.state.items():
        if not isinstance(p, DTensor):
            continue
        for k, v in list(state.items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, DTensor) and v.shape == p.to_local().shape:
                state[k] = DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


def build_sync(
    cfg: FTConfig,
    manager: MonarchManager,
    model: nn.Module,
    optimizer,
    lr_schedulers,
    params: Dict[str, nn.Parameter],
    group: int,
    floor: CommitFloor,
    refuse: Callable[[int, int], None],
) -> SyncStrategy:
    """The strategy for ``cfg.mode`` (validated by monarch_ft.config.job.validate)."""
    args = (manager, model, optimizer, lr_schedulers, params, cfg, group)
    if cfg.mode == "hsdp":
        return HSDPSync(*args)
    cls = {"localsgd": LocalSGDSync, "diloco": DiLoCoSync}[cfg.mode]
    return cls(*args, floor=floor, refuse=refuse)
