"""The TorchFT side of a rank: Manager, cross-group gradient sync, FT state dict.

Inside a group the ranks shard the model with FSDP2; across groups the same shard
(same group rank) is averaged through the Manager's reconfigurable process group,
the HSDP layout TorchTitan uses with TorchFT. A restarted group heals through the
Manager's checkpoint transport, which ships each rank's own shard only.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torchft import Manager
from torchft.checkpointing import CheckpointTransport

from monarch_ft.config.ft import FTConfig
from monarch_ft.rank.components.lighthouse_epoch import LighthouseEpoch, quorum_retries
from monarch_ft.rank.components.torchft_compat import QuorumView, manager_state_dict, offset_quorum_ids, process_group_open, watch_quorums
from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import read_int

logger: logging.Logger = logging.getLogger(__name__)


def to_local_tree(obj: Any) -> Any:
    """State dict with every DTensor replaced by its local shard (what a rank owns)."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: to_local_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_local_tree(v) for v in obj)
    return obj


def load_in_place(live: Any, incoming: Any, path: str = "") -> None:
    """Copy ``incoming`` into the live tensors of ``live`` (same structure), checking shapes.

    Loading in place keeps the FSDP parameters and the optimizer's state tensors the
    very objects the training loop holds; nothing is re-wrapped.
    """
    from torch.distributed.tensor import DTensor

    if isinstance(live, torch.Tensor):
        dst = live.to_local() if isinstance(live, DTensor) else live
        if not isinstance(incoming, torch.Tensor) or dst.shape != incoming.shape or dst.dtype != incoming.dtype:
            got = (tuple(incoming.shape), incoming.dtype) if isinstance(incoming, torch.Tensor) else type(incoming)
            raise ValueError(f"recovered state {path or '<root>'}: expected {tuple(dst.shape)} {dst.dtype}, got {got}")
        with torch.no_grad():
            dst.copy_(incoming)
    elif isinstance(live, dict):
        if set(live) != set(incoming):
            raise ValueError(f"recovered state {path or '<root>'}: keys differ ({sorted(map(str, set(live) ^ set(incoming)))[:5]})")
        for k in live:
            load_in_place(live[k], incoming[k], f"{path}.{k}" if path else str(k))
    elif isinstance(live, (list, tuple)):
        if len(live) != len(incoming):
            raise ValueError(f"recovered state {path}: length {len(incoming)} != {len(live)}")
        for i, (a, b) in enumerate(zip(live, incoming)):
            load_in_place(a, b, f"{path}[{i}]")


class CommitFloor:
    """The rank's guard that the job's committed step never goes back.

    The supervisor writes the job's committed step (the Manager's step after the newest
    commit of any group) to a control file. A group that joined a quorum with nobody
    holding the job's state (every peer died while it started) is at a lower step, its
    initial weights or an old state, and would silently train the job again from there
    and make later groups heal from it. Such a rank refuses to commit: it reports
    ``commit_refused`` and votes against the commit (TorchFT's ``report_error``), so a
    group that is merely behind (back from a partition, in a stale quorum) heals from its
    peers on the next quorum, in place. After MAX_REFUSALS in a row it has nobody to heal
    from and ends with ``RankExit.COMMIT_BELOW_FLOOR``; the supervisor relaunches the
    group, which then loads the newest checkpoint.

    Args:
        path: the control file (RunLayout.commit_floor); missing means 0.
    """

    # Refusals in a row after which the group gives up (exit): a stale group in a quorum
    # with a peer heals on the next quorum; one alone has nobody to heal from.
    MAX_REFUSALS = 3

    def __init__(self, path: str) -> None:
        self.path = path
        self.refusals = 0  # consecutive refused commits

    def job_step(self) -> int:
        return read_int(self.path)

    def allows(self, step: int) -> tuple[bool, int]:
        """Whether committing ``step`` (leaving the rank at ``step + 1``) keeps up with the job.

        Peers of one quorum commit the same step, so committing the job's newest step
        again is allowed; anything lower is not."""
        job = self.job_step()
        allowed = step + 1 >= job
        self.refusals = 0 if allowed else self.refusals + 1
        return allowed, job


class RecordingTransport(CheckpointTransport):
    """Wraps any CheckpointTransport and reports each send/receive (peer, bytes, seconds).

    The supervisor's event log learns from these reports which peer a restarted group
    healed from and how long moving the weights took, whatever the transport.
    """

    def __init__(self, inner: CheckpointTransport, report: Callable[..., None]) -> None:
        self.inner = inner
        self._report = report

    def metadata(self) -> str:
        return self.inner.metadata()

    def send_checkpoint(self, dst_ranks: List[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        start = time.time()
        self.inner.send_checkpoint(dst_ranks, step, state_dict, timeout)
        self._report(EventKind.CHECKPOINT_SENT, dst_ranks=list(dst_ranks), step=step, seconds=time.time() - start)

    def disallow_checkpoint(self) -> None:
        self.inner.disallow_checkpoint()

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        start = time.time()
        self._report(EventKind.RECOVERY_STARTED, src_replica_rank=src_rank, src=metadata, step=step)
        try:
            state = self.inner.recv_checkpoint(src_rank, metadata, step, timeout)
        except Exception as e:
            self._report(EventKind.RECOVERY_FAILED, src_replica_rank=src_rank, src=metadata, step=step, error=str(e)[:500])
            raise
        # Which peers served it, and how many chunks were fetched again from another after a
        # failed checksum (the sharded transport; {} for others).
        received = self.inner.receive_report() if hasattr(self.inner, "receive_report") else {}
        self._report(
            EventKind.WEIGHTS_RECOVERED,
            src_replica_rank=src_rank,
            src=metadata,
            step=step,
            bytes=tensor_bytes(state),
            seconds=time.time() - start,
            started=start,
            **{k: received[k] for k in ("chunks", "refetched", "peers", "failures") if k in received},
        )
        return state

    def offer(self, step: int, state_dict: Callable[[], Any]) -> None:
        """See ShardedTransport.offer (a transport without it serves only what TorchFT staged)."""
        if hasattr(self.inner, "offer"):
            self.inner.offer(step, state_dict)

    def set_test_fault(self, fault: dict) -> bool:
        """See ShardedTransport.set_test_fault; False for a transport without the hook."""
        if not hasattr(self.inner, "set_test_fault"):
            return False
        self.inner.set_test_fault(fault)
        return True

    def shutdown(self, wait: bool = True) -> None:
        self.inner.shutdown(wait=wait)


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def build_transport(
    cfg: FTConfig, timeout: timedelta, lighthouse_addr: str, report: Callable[..., None], fallback_peers: Optional[Callable[[int, int], List[str]]] = None
) -> CheckpointTransport:
    """The checkpoint transport a restarted group heals through (``ft.transport``).

    ``sharded`` (ours) binds and advertises the address that
    :mod:`monarch_ft.transport.interface` picks (``ft.transport_interface``, else the
    RDMA port's interface, else the route to the Lighthouse); the choice and why are
    logged and reported as a ``transport_interface`` event. ``http`` is TorchFT's
    HTTPTransport (it advertises the host name). ``fallback_peers(src_rank, step)``: the
    addresses of the other healthy peers a sharded receive fetches a chunk from again when one
    fails its checksum. TorchFT's PGTransport over the
    Manager's own gloo process group timed out on every receive here (torchft 0.2.0),
    so ``pg`` is refused up front by config validation; it is measured in
    benchmarks/transport_bench.py over a dedicated process group.
    """
    from monarch_ft.transport import build_checkpoint_transport

    if cfg.transport == "sharded":
        from monarch_ft.transport.interface import resolve

        choice = resolve(cfg.transport_interface, lighthouse_addr)
        logger.info("checkpoint transport on %s (%s) because: %s", choice.address, choice.interface, choice.why)
        report(EventKind.TRANSPORT_INTERFACE, address=choice.address, interface=choice.interface, why=choice.why)
        return build_checkpoint_transport("sharded", timeout=timeout, host=choice.address, bind_host=choice.bind, fallback_metadata=fallback_peers)
    if cfg.transport == "http":
        return build_checkpoint_transport("http", timeout=timeout)
    raise ValueError(f"ft.transport={cfg.transport!r}: choose sharded or http")


class MonarchManager(Manager):
    """torchft's Manager with three small additions the sync strategies need, through its
    public methods only (what the trainer needs of its process group and transport is kept
    by :class:`FTParts`; what torchft has no public seam for is in
    monarch_ft.rank.components.torchft_compat).

    * ``before_quorum``: called at the top of every ``start_quorum`` (a rank that was frozen
      waits there: monarch_ft.rank.components.freeze).
    * ``before_commit``: called at the top of every ``should_commit``, after the quorum and
      the sync's collectives. In localsgd/diloco torchft's own optimizer hooks call
      ``should_commit``, so this is the one place between a heal and a commit where a rank
      can learn who took part (monarch_ft.rank.components.sync) and refuse a commit below the
      job's floor (CommitFloor).
    * ``heals``: how many times the Manager's own state was loaded (a heal from a peer, or a
      disk checkpoint), so a step record can say that a group's window was replaced.
    * ``seconds``: wall time the calling thread spent in quorum (start_quorum, wait_quorum)
      and in the commit vote, for the overhead benchmark's per-step breakdown. Nested calls
      (start_quorum waits for the quorum itself) count once.
    * With ``ft.close_failed_collective=true``, a failed step closes the cross-group process group before the commit vote
      (:func:`close_failed_process_group`), so no peer waits out ``ft.timeout_s`` in a
      collective this rank will not finish (``close_failed_step``, ``ft.close_failed_collective``).
      ``closed_after_failure`` counts those closes.
    * ``quorum``: the newest quorum as a :class:`QuorumView` (who is in it, who is at its newest
      step), set on the quorum thread before the Manager acts on it.
    * ``count_healing``: whether a group that heals in a quorum counts in that step's averages.
      TorchFT counts it in a synchronous quorum (it heals before the step's compute, and in DDP
      it then computes a gradient of its own); in localsgd/diloco it heals at the sync itself and
      would bring its donor's window a second time, so the semi-sync strategies set it False: a
      group behind the quorum's newest step then sends zeros and the average divides by the
      groups at that step, as TorchFT's asynchronous quorum does (torchft manager.py,
      ``_async_quorum``: ``max_replica_rank``, ``max_world_size``).
    * ``sync_trace``: when set (a :class:`SyncTrace`), the sums of what this rank sends into each
      average and what comes out, for the step record (rank.components.sync).
    * :meth:`commit_nothing`: the commit vote of a quorum in which this group trains nothing.
    * ``past_finish``: when set (localsgd/diloco), asked after a sync's quorum: do its peers
      hold at the job's finish (SemiSync's exchange, the quorum's first collective, says who
      holds)? This group missed the job's last sync (a straggler the peers synced without,
      healed in this quorum to their step), and what the holders run in the quorum is
      :meth:`commit_nothing`'s vote, not the sync's averages. So its averages run no
      collective and its commit vote is :meth:`commit_nothing`'s, returning False (torchft's
      sync then keeps the healed weights); :meth:`take_served_past_finish` says so once. Running the
      sync's averages against the holders' collective, gloo aborted a holder ("Received data
      size doesn't match expected size") and the group's record of the sync read as a commit
      below the job's step (a job test's localsgd run at dff7bb5; replayed in
      test_sync_modes_jobs).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.before_quorum: Optional[Callable[[], None]] = None
        self.before_commit: Optional[Callable[[], None]] = None
        self.heals = 0
        self.seconds = {"quorum": 0.0, "commit": 0.0}
        self._timing_depth = 0
        self.closed_after_failure = 0
        self.close_failed_step = False
        self._cross_pg = kwargs.get("pg")
        self.quorum: Optional[QuorumView] = None
        self.count_healing = True
        self.sync_trace: Optional[SyncTrace] = None
        self.past_finish: Optional[Callable[[], bool]] = None
        self.quorums = 0  # quorums started by this process: what a once-per-quorum exchange keys on
        self.served_past_finish = False
        self._serving = False
        # How long should_commit waits for the group's other ranks (FTConfig.vote_timeout_s);
        # None: the Manager's timeout, as torchft does.
        self.vote_timeout: Optional[timedelta] = None
        super().__init__(*args, **kwargs)

    def _healed_past_finish(self) -> bool:
        if self.past_finish is None or self._serving:
            return False
        self.wait_quorum()
        return self.past_finish()

    @contextmanager
    def _timed(self, key: str) -> Iterator[None]:
        self._timing_depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timing_depth -= 1
            if self._timing_depth == 0:
                self.seconds[key] += time.perf_counter() - start

    def take_served_past_finish(self) -> bool:
        """Whether a commit vote since the last call served a quorum its peers held at the finish
        (``past_finish``), then reset: that sync committed nothing of this group's."""
        served, self.served_past_finish = self.served_past_finish, False
        return served

    def take_seconds(self) -> Dict[str, float]:
        """The time accrued since the last call, then reset."""
        out, self.seconds = self.seconds, {"quorum": 0.0, "commit": 0.0}
        return out

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        self.quorums += 1
        if self.before_quorum is not None:
            self.before_quorum()
        with self._timed("quorum"):
            super().start_quorum(*args, **kwargs)

    def wait_quorum(self) -> None:
        with self._timed("quorum"):
            super().wait_quorum()

    def should_commit(self, timeout: Optional[timedelta] = None) -> bool:
        if self._healed_past_finish():
            self.served_past_finish = True
            self.commit_nothing()
            return False
        if self.close_failed_step and self.errored() is not None and self._cross_pg is not None:
            # The quorum may still be configuring the process group when the step failed
            # before its collective (the allreduce, which waits for it, was skipped): close
            # the one this step's peers use, not one being replaced under us.
            try:
                self.wait_quorum()
            except Exception:  # the quorum failed too: its error is the Manager's already
                pass
            if close_failed_process_group(self._cross_pg):
                self.closed_after_failure += 1
        if self.before_commit is not None:
            self.before_commit()
        with self._timed("commit"):
            return super().should_commit(timeout or self.vote_timeout)

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        self.heals += 1
        super().load_state_dict(state_dict)

    def is_participating(self) -> bool:
        if not self.count_healing and self.quorum is not None and not self.quorum.at_max_step:
            return False
        return super().is_participating()

    def num_participants(self) -> int:
        n = super().num_participants()  # waits for the quorum
        if not self.count_healing and self.quorum is not None:
            return min(n, self.quorum.max_world_size)
        return n

    def allreduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self._healed_past_finish():
            from torchft.work import _DummyWork

            return _DummyWork(tensor)  # the holders run no average (past_finish)
        trace = self.sync_trace
        if trace is None or self.errored() is not None:
            return super().allreduce(tensor, *args, **kwargs)
        self.wait_quorum()
        sent = float(torch.sum(tensor.detach(), dtype=torch.float64)) if self.is_participating() else 0.0
        work = super().allreduce(tensor, *args, **kwargs)
        trace.add(sent, tensor)
        return work

    def commit_nothing(self) -> bool:
        """The commit vote of a quorum in which this group trains nothing (it holds past the
        finish, or joins the peers there): the vote the protocol needs, with the Manager's step
        kept where the quorum left it (a heal in it included), not one past.

        TorchFT counts every commit as a step; a group held open at the finish serves quorums
        for a healing peer and would end one step past the finish for each, and hand that step
        to the peer it heals (``rank_finished`` 41 of 40). The step and ``batches_committed``
        are put back through the Manager's own state dict (its public checkpoint seam), not as
        a heal.

        Returns:
            the vote's outcome (whether the quorum was healthy).
        """
        self.wait_quorum()
        kept = Manager.state_dict(self)
        self._serving = True
        try:
            committed = self.should_commit()
        finally:
            self._serving = False
        Manager.load_state_dict(self, kept)
        return committed


class SyncTrace:
    """Sums of one sync's averages on one rank (MonarchManager.sync_trace): what this rank sent
    (0 for a group that sends zeros: it heals in the sync) and what the average came out as.

    A sum is linear, so across the groups of one sync ``out = sum(sent) / counted``: the step
    record carries both, and a job test checks that each window was counted once."""

    def __init__(self) -> None:
        self._sent = 0.0
        self._outs: List[torch.Tensor] = []

    def add(self, sent: float, out: torch.Tensor) -> None:
        """One allreduce: the sum sent, and the tensor the average is written into."""
        self._sent += sent
        self._outs.append(out)

    def take(self) -> Optional[Tuple[float, float]]:
        """(sent, out) since the last take, the averages complete (None: no allreduce ran)."""
        if not self._outs:
            return None
        out = sum(float(torch.sum(t.detach(), dtype=torch.float64)) for t in self._outs)
        sent, self._sent, self._outs = self._sent, 0.0, []
        return sent, out


def close_failed_process_group(pg: Any) -> bool:
    """Close a cross-group process group whose step failed, at once: True when one was open.

    Why: in gloo's ring allreduce a dead peer's sockets close under its two neighbours only.
    Their collective fails at once, but they keep their own connections open until the next
    quorum reconfigures the group, so every other survivor waits in the collective until
    ``ft.timeout_s`` (about 3 s a fault at 8 and 16 groups in benchmarks/scale_bench.py).
    Dropping the failed group's process group closes its sockets, and the failure runs round
    the ring in milliseconds (8 ranks, one killed mid-allreduce: the last survivor failed
    after 3.06 s; with each closing on failure, after 0.08 s). gloo has no abort of a
    collective in flight (its ``abort`` returns and the collective goes on), so this is how
    a failure reaches the far side of the ring; on NCCL torchft's ``abort`` also aborts the
    communicator, as its own timeout path does.

    Safe for TorchFT: the step is not committed (the rank has already reported the error), the
    Manager's collectives until the next quorum are no-ops, and the commit failure makes the
    Lighthouse bump the quorum id, so the next quorum configures a new process group even when
    its members did not change (torchft ``lighthouse.rs``, "Detected commit failures").

    Args:
        pg: torchft's reconfigurable ProcessGroupGloo/NCCL (its ``abort`` drops the backend).
    """
    if not process_group_open(pg):
        return False
    try:
        pg.abort()
    except Exception as e:  # a close that fails leaves the old group to the next quorum, as before
        logger.warning("closing the failed cross-group process group: %s", e)
        return False
    return True


def _recording(pg_class: type) -> type:
    """``pg_class`` whose ``configure`` remembers the quorum it was configured for.

    The Manager reconfigures its process group once per new Lighthouse quorum with the
    quorum id (torchft's ProcessGroup.configure signature); keeping it here gives the step
    record its ``quorum_id`` without reading the Manager's private attributes."""

    class Recording(pg_class):
        quorum_id: int = -1

        def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, quorum_id: Optional[int] = None, *args: Any, **kwargs: Any) -> None:
            super().configure(store_addr, replica_id, rank, world_size, quorum_id, *args, **kwargs)
            if quorum_id is not None:
                self.quorum_id = quorum_id

    Recording.__name__ = Recording.__qualname__ = f"Recording{pg_class.__name__}"
    return Recording


@dataclass
class CrossGroup:
    """What a rank needs across groups before it knows which group it is: the cross-group
    process group (unconfigured until the first quorum) and the checkpoint transport
    (bound and serving). Neither talks to the Lighthouse, so a warm standby builds them
    ahead of its promotion (monarch_ft.rank.standby_wait).

    Args:
        process_group: torchft's ProcessGroupGloo/NCCL, recording its quorum id.
        transport: the RecordingTransport peers heal from.
    """

    process_group: Any
    transport: "RecordingTransport"


def build_cross_group(
    cfg: FTConfig, *, lighthouse_addr: str, report: Callable[..., None], backend: str, fallback_peers: Optional[Callable[[int, int], List[str]]] = None
) -> CrossGroup:
    """``backend``: ``nccl`` or ``gloo`` for the cross-group process group (see monarch_ft/common/devices.py);
    ``fallback_peers``: see build_transport."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    timeout = timedelta(seconds=cfg.timeout_s)
    pg = _recording(ProcessGroupNCCL if backend == "nccl" else ProcessGroupGloo)(timeout=timeout)
    transport = RecordingTransport(build_transport(cfg, timeout, lighthouse_addr, report, fallback_peers), report)
    return CrossGroup(pg, transport)


@dataclass
class FTParts:
    """What the trainer and the fault agent use of TorchFT, through public seams only.

    Args:
        manager: the rank's MonarchManager (quorum, allreduce, commit, heal).
        cross: the process group and transport the Manager was built on, kept by us.
    """

    manager: MonarchManager
    cross: CrossGroup

    @property
    def quorum_id(self) -> int:
        """The Lighthouse quorum this rank last configured for (the step record's quorum_id)."""
        return self.cross.process_group.quorum_id

    def checkpoint_metadata(self) -> str:
        """Where peers fetch this rank's state from (its checkpoint transport's address)."""
        return self.cross.transport.metadata()

    def abort_process_group(self) -> None:
        """Abort the cross-group process group (gloo here, NCCL's communicator abort on CUDA):
        the in-flight collective fails on every participant and the step is discarded."""
        self.cross.process_group.abort()

    def current_step(self) -> int:
        return self.manager.current_step()

    def offer_state(self) -> None:
        """Offer this rank's committed state to a healing peer whose chunk from TorchFT's
        chosen source failed its checksum (RecordingTransport.offer). Called after the step's
        quorum began and before its commit vote, while the state cannot change; the Manager's
        step is the committed state's step."""
        manager = self.manager
        self.cross.transport.offer(manager.current_step(), lambda: manager_state_dict(manager))

    def arm_transfer_fault(self, fault: dict) -> bool:
        """A test hook: damage what this rank's transport sends from now on (ShardedTransport.set_test_fault)."""
        return self.cross.transport.set_test_fault(fault)


def build_manager(
    cfg: FTConfig,
    cross: CrossGroup,
    *,
    group: int,
    rank: int,
    world_size: int,
    store_addr: str,
    store_port: int,
    lighthouse_addr: str,
    hostname: str,
    state_dict: Callable[[], Dict[str, Any]],
    load_state_dict: Callable[[Dict[str, Any]], None],
    use_async_quorum: bool = True,
    lighthouse_epoch_path: Optional[str] = None,
) -> FTParts:
    """The Manager of replica ``group_<group>`` over ``cross`` (see :func:`build_cross_group`).

    The Manager heartbeats the Lighthouse from construction on, so it is built only once
    the rank knows its group (a standby builds it on promotion, never before: a
    heartbeating replica that never asks for a quorum holds every quorum up).

    ``lighthouse_epoch_path``: the run's Lighthouse epoch file (monarch_ft.controller.lighthouse): quorum
    ids are offset per Lighthouse restart. Whatever it is, a quorum the Lighthouse failed is
    retried across ``ft.quorum_timeout_s`` (rank.components.lighthouse_epoch).

    ``use_async_quorum``: hsdp overlaps the next quorum with compute (True); torchft's DiLoCo
    refuses an async quorum, and localsgd uses the same synchronous one (see sync.py)."""
    timeout = timedelta(seconds=cfg.timeout_s)
    manager = MonarchManager(
        pg=cross.process_group,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=cfg.min_replica_size,
        use_async_quorum=use_async_quorum,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=cfg.quorum_timeout_s),
        connect_timeout=timedelta(seconds=cfg.connect_timeout_s),
        # Frequent heartbeats let the Lighthouse evict a dead group after a short ft.heartbeat_timeout_ms
        # (its only way to drop one): the survivors stall about that long (docs/design/eviction.md).
        heartbeat_interval=timedelta(milliseconds=cfg.heartbeat_interval_ms),
        rank=rank,
        world_size=world_size,
        store_addr=store_addr,
        store_port=store_port,
        lighthouse_addr=lighthouse_addr,
        replica_id=f"group_{group}",
        hostname=hostname,
        checkpoint_transport=cross.transport,
        # Every group initialises from the same seed, so step 0 needs no weight sync.
        init_sync=False,
        # A Lighthouse restarted under a quorum: the quorum completes at the new one.
        quorum_retries=quorum_retries(cfg.quorum_timeout_s),
    )
    manager.close_failed_step = cfg.close_failed_collective
    manager.vote_timeout = timedelta(seconds=cfg.vote_timeout_s)
    if lighthouse_epoch_path:
        offset_quorum_ids(manager, LighthouseEpoch(lighthouse_epoch_path).quorum_id_offset)
    watch_quorums(manager, lambda quorum: setattr(manager, "quorum", quorum))
    return FTParts(manager, cross)


# A finish step travels in a summed float32 collective as two slots per group, value // 2**20
# and value % 2**20 + 1 (0: no offer), each exact, each written by its group alone.
_FINISH_SPLIT = 1 << 20


def offer_finish(slots: torch.Tensor, num_groups: int, group: int, finish: Optional[int]) -> None:
    """Write ``group``'s finish into ``slots`` (2 x ``num_groups`` zeros; None: no offer)."""
    if finish is not None:
        slots[group] = float(finish // _FINISH_SPLIT)
        slots[num_groups + group] = float(finish % _FINISH_SPLIT) + 1.0


def lowest_finish(summed: List[float], num_groups: int, members: List[int]) -> Optional[int]:
    """The lowest finish ``members`` offered in the summed slots (None: none offered)."""
    offers = [int(round(summed[g])) * _FINISH_SPLIT + int(round(summed[num_groups + g])) - 1 for g in members if summed[num_groups + g] > 0]
    return min(offers) if offers else None


@dataclass(frozen=True)
class Membership:
    """What a semi-sync quorum's first collective tells every group of it (SemiSync's exchange):
    one summed float32 tensor of 4 x ``num_groups`` slots, each written by its group alone.

    Args:
        members: the groups counted in the sync (a group healing in it sends zeros).
        holders: the counted groups that hold at the finish in this quorum (they run no average).
        finish: the lowest finish a counted group read (None: none offered).
    """

    members: List[int]
    holders: List[int]
    finish: Optional[int] = None

    @staticmethod
    def slots(num_groups: int, group: int, finish: Optional[int], holding: bool) -> torch.Tensor:
        """``group``'s contribution to the exchange.

        Args:
            num_groups: the job's replica groups.
            group: this group.
            finish: the finish it read (None: no offer).
            holding: whether it holds at the finish in this quorum.
        """
        slots = torch.zeros(4 * num_groups, dtype=torch.float32)
        slots[group] = 1.0
        offer_finish(slots[num_groups : 3 * num_groups], num_groups, group, finish)
        slots[3 * num_groups + group] = 1.0 if holding else 0.0
        return slots

    @classmethod
    def read(cls, summed: List[float], num_groups: int) -> "Membership":
        """The exchange's outcome from the summed slots.

        Args:
            summed: the slots after the SUM allreduce.
            num_groups: the job's replica groups.
        """
        members = [g for g in range(num_groups) if summed[g] > 0]
        holders = [g for g in members if summed[3 * num_groups + g] > 0]
        return cls(members, holders, lowest_finish(summed[num_groups : 3 * num_groups], num_groups, members))

    def peers_hold(self, group: int) -> bool:
        """Whether a group other than ``group`` holds: ``group``, come to sync, must then run
        none of the sync's averages (MonarchManager.past_finish).

        Args:
            group: the asking group.
        """
        return any(g != group for g in self.holders)


@dataclass(frozen=True)
class Synced:
    """What one :meth:`GradSync.sync` learned beside the averaged gradients.

    Args:
        members: the groups whose gradients were counted (the step's participants).
        vetoes: the groups whose own gradient failed its check (every group votes the step down).
        micro_batches: the micro-batches summed over every group (the average's divisor).
        finish: the lowest finish step a counted group read this step (None: none offered).
    """

    members: List[int]
    vetoes: List[int]
    micro_batches: int
    finish: Optional[int] = None


class GradSync:
    """Sums the local gradient shards across participating groups in one collective, and divides
    by the micro-batches summed.

    One flat buffer per step (not one collective per parameter), with three slots per group
    appended: a one-hot slot, so that after the sum the slots that are non-zero name exactly the
    groups whose gradients were counted this step; a veto slot, raised by a group whose own
    gradient failed its check (rank.components.integrity.GradGuard); and a count slot, the
    micro-batches the group's gradient sums (``ft.global_batch=constant``: its data slots, one or
    more; 0 for a group that sends nothing). Dividing by the summed count, not by the groups,
    makes the result the per-token average also when groups summed unequal numbers of equal
    micro-batches (records.global_batch.assign_slots), and it is TorchFT's average when each
    counts one. A group that vetoes sends zeros instead of its gradient, and every group learns
    of the veto from the same collective, so every one can vote against the commit: the step is
    discarded everywhere in this step, not after a collective timeout.

    Two more slots per group carry the finish step the group read (high and low parts, each exact
    in float32), so every group of the step learns the lowest finish any member read: the finish
    the groups agree on (see rank.trainer.StopAt for why a read alone cannot be agreed on).
    """

    def __init__(self, params: List[nn.Parameter], num_groups: int, group: int) -> None:
        self.params = params
        self.num_groups, self.group = num_groups, group

    def sync(self, manager, veto: bool = False, micro_batches: int = 1, finish: Optional[int] = None) -> Synced:
        """Average the shards; returns the groups counted, those that vetoed, the micro-batches
        summed and the lowest finish the counted groups read (:class:`Synced`).

        Args:
            manager: the Manager whose process group sums across groups.
            veto: this rank's gradient failed its check: send zeros, raise the veto slot.
            micro_batches: how many micro-batches this rank's gradient is the sum of.
            finish: the finish step this group read (the same on every rank of the group; None:
                none to offer, the default's ``training.steps`` being as good as any).
        """
        from torch.distributed import ReduceOp
        from torch.distributed.tensor import DTensor

        grads = []
        for p in self.params:
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
                p.grad = g
            grads.append(g.to_local() if isinstance(g, DTensor) else g)
        n = self.num_groups
        width = 5 * n
        slots = torch.zeros(width, dtype=torch.float32, device=grads[0].device)
        slots[self.group] = 1.0
        if veto:
            slots[n + self.group] = 1.0
        else:
            slots[2 * n + self.group] = float(micro_batches)
        offer_finish(slots[3 * n :], n, self.group, finish)
        flat = torch.cat([g.reshape(-1) for g in grads] + [slots])
        if veto:
            flat[: flat.numel() - width].zero_()  # a suspect gradient is never sent
        manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        tail = flat[flat.numel() - width :].tolist()
        total = int(round(sum(tail[2 * n : 3 * n])))
        offset = 0
        with torch.no_grad():
            if total > 1:
                flat[: flat.numel() - width].div_(total)
            for g in grads:
                k = g.numel()
                g.copy_(flat[offset : offset + k].view_as(g))
                offset += k
        members = [i for i in range(n) if tail[i] > 0]
        return Synced(members, [i for i in range(n) if tail[n + i] > 0], total, lowest_finish(tail[3 * n :], n, members))
