"""torchft 0.2.0's private surface, in one place.

The rest of monarch_ft uses torchft through its public API: the Manager's constructor and
methods, ``ProcessGroup.configure``, the ``CheckpointTransport`` interface, and LocalSGD and
DiLoCo as the optimizer hooks they install. What that API cannot do is done here, one
function each, whose docstring says what torchft lacks publicly and why monarch_ft needs
it. :data:`PRIVATE_SURFACE` lists every private name these functions touch, and
tests/unit/test_torchft_contract.py checks each one against the installed torchft: the attribute
is there and has the expected signature or type. A torchft upgrade that moves one fails
that test and names it, not a job minutes later.

What torchft's public surface already covers is not here: a Lighthouse restart under a
quorum in flight is retried by the Manager's own ``quorum_retries``
(monarch_ft.rank.components.lighthouse_epoch.quorum_retries).

The controller also depends on one packaging detail. monarch_ft.controller.lighthouse starts the
Lighthouse from torchft's extension module (``torchft._torchft.lighthouse_main``, the
function torchft's own ``torchft_lighthouse`` console script calls) without importing
torch. That code stays with the controller, which does not import the ranks' modules, and
the contract test checks it as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch


@dataclass(frozen=True)
class Private:
    """One private name of torchft this module relies on.

    Args:
        owner: the class, as ``module.Class``.
        name: the attribute.
        params: for a method, its parameters' names in order (what a call relies on).
        attr_type: for an instance attribute, the type's name its value has.
    """

    owner: str
    name: str
    params: Optional[tuple] = None
    attr_type: Optional[str] = None


PRIVATE_SURFACE = (
    # offset_quorum_ids, watch_quorums (the result's fields they read are _torchft.QuorumResult's, public in its .pyi)
    Private("torchft.manager.Manager", "_client", attr_type="ManagerClient"),
    Private(
        "torchft._torchft.ManagerClient",
        "_quorum",
        params=("self", "group_rank", "step", "checkpoint_metadata", "shrink_only", "init_sync", "commit_failures", "timeout"),
    ),
    # quorum_pending
    Private("torchft.manager.Manager", "_quorum_future", attr_type="NoneType"),  # until the first start_quorum: then a Future
    # manager_state_dict
    Private("torchft.manager.Manager", "_manager_state_dict", params=("self",)),
    # local_step, localsgd_sync_in_quorum, diloco_sync_in_quorum
    Private("torchft.local_sgd.LocalSGD", "_local_step", attr_type="int"),
    Private("torchft.local_sgd.LocalSGD", "_perform_sync", params=("self",)),
    Private("torchft.local_sgd.DiLoCo", "_local_step", attr_type="int"),
    Private("torchft.local_sgd.DiLoCo", "_fragments", attr_type="list"),
    Private("torchft.local_sgd.DiLoCo", "_current_fragment", params=("self",)),
    Private("torchft.local_sgd._StreamingDiLoCoFragment", "prepare_sync", params=("self",)),
    Private("torchft.local_sgd._StreamingDiLoCoFragment", "perform_sync", params=("self",)),
    # process_group_open
    Private("torchft.process_group.ProcessGroupWrapper", "_pg", attr_type="ProcessGroup"),
    # diloco_save_global, diloco_global_copies
    Private("torchft.local_sgd.DiLoCo", "_save_parameters", params=("self",)),
    Private("torchft.local_sgd._StreamingDiLoCoFragment", "original_parameters", attr_type="dict"),
)


# ---------------------------------------------------------------- the process group
def process_group_open(pg: Any) -> bool:
    """Whether torchft's reconfigurable process group holds a backend now.

    torchft's ``ProcessGroupWrapper`` keeps the backend of the current quorum in ``_pg``, None
    before the first ``configure`` and after ``abort``; it has no public way to ask.
    monarch_ft.rank.components.ft.close_failed_process_group closes one only when it is open.

    Args:
        pg: a torchft ProcessGroupGloo/NCCL.
    """
    return getattr(pg, "_pg", None) is not None


# ---------------------------------------------------------------- the Manager's quorums
def quorum_pending(manager: Any) -> bool:
    """Whether the quorum the Manager started for this step is still running: a wait for it
    would block (torchft's ``Manager`` keeps it as ``_quorum_future``; it has no public way to
    ask without waiting). The trainer marks such a wait as the sync phase, and only such a
    wait: a wait that returns at once must not split a rank's compute phase in two (the hang
    rules blame the rank longest in its phase).

    Args:
        manager: the rank's Manager, its quorum started.
    """
    future = getattr(manager, "_quorum_future", None)
    return future is not None and not future.done()


class _OffsetQuorum:
    """A torchft QuorumResult whose ``quorum_id`` is moved by an offset (every other field as is)."""

    def __init__(self, result: Any, offset: int) -> None:
        self._result = result
        self.quorum_id = result.quorum_id + offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


class _OffsetQuorumClient:
    """torchft's ManagerClient, with each quorum result's id moved by ``offset()``."""

    def __init__(self, client: Any, offset: Callable[[], int]) -> None:
        self._client = client
        self._offset = offset

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        result = self._client._quorum(*args, **kwargs)
        offset = self._offset()
        return _OffsetQuorum(result, offset) if offset else result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def offset_quorum_ids(manager: Any, offset: Callable[[], int]) -> None:
    """Move every quorum id ``manager`` receives by ``offset()``, read when the quorum returns.

    What torchft lacks: the Manager reads the Lighthouse's quorum in ``_async_quorum`` straight
    from its private ``ManagerClient._quorum``. Nothing public can see or adjust the result
    before the Manager acts on it, and a Lighthouse always numbers its quorums from 1.

    Why monarch_ft needs it: a restarted Lighthouse numbers its quorums from 1 again. The
    Manager reconfigures its process group only when the quorum id changes, and it names the
    cross-group store prefix after the id (``torchft/<quorum_id>/<rank>``). A repeated id
    would keep a stale process group or rendezvous on an earlier quorum's keys.
    monarch_ft.rank.components.lighthouse_epoch gives every Lighthouse restart its own range of
    ids, the same on every rank.
    """
    manager._client = _OffsetQuorumClient(manager._client, offset)


@dataclass(frozen=True)
class QuorumView:
    """What one Lighthouse quorum told this rank, the same for every member of the quorum (but the
    rank fields): who is in it and how many of them are at its newest step.

    Args:
        quorum_id: the quorum's id (offset per Lighthouse epoch).
        groups: the replica groups in the quorum, ascending (from their replica ids ``group_<g>:...``).
        max_world_size: how many of them are at the quorum's newest step (the others heal in it).
        at_max_step: whether this rank's group is one of those.
        max_step: the quorum's newest step.
    """

    quorum_id: int
    groups: tuple
    max_world_size: int
    at_max_step: bool
    max_step: int

    @property
    def all_current(self) -> bool:
        """Every group of the quorum is at its newest step: none heals in it."""
        return self.max_world_size == len(self.groups)


def _group_of(replica_id: str) -> int:
    """``group_<g>:<uuid>`` -> g (the replica id build_manager gives, with the uuid TorchFT appends)."""
    return int(replica_id.split(":", 1)[0].rsplit("_", 1)[1])


class _WatchedQuorumClient:
    """torchft's ManagerClient, handing each quorum result to ``seen`` as a :class:`QuorumView`."""

    def __init__(self, client: Any, seen: Callable[[QuorumView], None]) -> None:
        self._client = client
        self._seen = seen

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        result = self._client._quorum(*args, **kwargs)
        self._seen(
            QuorumView(
                quorum_id=result.quorum_id,
                groups=tuple(sorted(_group_of(r) for r in result.replica_ids)),
                max_world_size=int(result.max_world_size),
                at_max_step=result.max_replica_rank is not None,
                max_step=int(result.max_step),
            )
        )
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def watch_quorums(manager: Any, seen: Callable[[QuorumView], None]) -> None:
    """Hand every quorum ``manager`` receives to ``seen`` (on the Manager's quorum thread, before the
    Manager acts on it).

    What torchft lacks: the Manager reads its quorum in ``_async_quorum`` from its private
    ``ManagerClient._quorum`` and keeps only a few numbers of it; which groups are in the quorum
    (``replica_ids``) and how many are at its newest step (``max_world_size``, the groups that do
    not heal in it) are not kept, and in a synchronous quorum ``num_participants`` counts the
    healing groups too.

    Why monarch_ft needs it: a step's participants decide which data each group trains under
    ``ft.global_batch=constant`` (rank.components.global_batch), and a group that heals at a sync
    must not be counted in that sync's average (rank.components.ft.MonarchManager). Wrap after
    :func:`offset_quorum_ids`, so the ids seen are the offset ones.
    """
    manager._client = _WatchedQuorumClient(manager._client, seen)


def manager_state_dict(manager: Any) -> Dict[str, Any]:
    """What the Manager sends a healing peer (its own step and counters, and every registered
    user state dict), built as its ``send_checkpoint`` builds it.

    What torchft lacks: a public accessor for ``_manager_state_dict``; only the peer the
    Lighthouse names as a healing rank's source stages it, inside ``_async_quorum``.

    Why monarch_ft needs it: when a chunk from that source fails its checksum, the receiver
    fetches it again from another healthy peer (rank.components.ft.FTParts.offer_state), which
    must serve exactly what the source serves, in the same layout.
    """
    return manager._manager_state_dict()


# ---------------------------------------------------------------- LocalSGD and DiLoCo
def local_step(impl: Any) -> int:
    """Inner steps since the last sync, by torchft's own counter (LocalSGD or DiLoCo).

    What torchft lacks: a public accessor for ``_local_step``.

    Why monarch_ft needs it: a group's position (manager step x window + local step), the
    LR schedule and the step records all come from it. A counter of our own beside it could
    drift from the one that decides when torchft syncs.
    """
    return impl._local_step


def localsgd_sync_in_quorum(impl: Any) -> None:
    """LocalSGD's sync (average the parameters, commit), in a quorum the caller already holds.

    What torchft lacks: the public ``LocalSGD.sync()`` starts its own quorum first, with the
    Manager's default timeout.

    Why monarch_ft needs it: a relaunched group joins (sync.SemiSync._join) with a quorum of
    its own, started with a longer timeout, that heals it. Only after that quorum does it
    know whether the peers sync (it takes part) or only hold (it commits nothing new). A
    second quorum would not match the peers' one.
    """
    impl._perform_sync()
    impl._local_step = 0


def diloco_sync_in_quorum(impl: Any) -> None:
    """What DiLoCo's step hook does at ``local_step == sync_every`` (with fragment_sync_delay
    0): prepare and sync the current fragment, in a quorum the caller already holds.

    What torchft lacks: DiLoCo has no public sync at all. It runs only from its optimizer
    hook, which starts the quorum itself.

    Why monarch_ft needs it: the same join as :func:`localsgd_sync_in_quorum`.
    """
    fragment = impl._fragments[impl._current_fragment()]
    fragment.prepare_sync()
    fragment.perform_sync()
    impl._local_step = 0


def diloco_save_global(impl: Any) -> None:
    """Make the model's current weights every fragment's last global copy.

    What torchft lacks: DiLoCo saves its global copy only at construction and after a sync
    (``_save_parameters``).

    Why monarch_ft needs it: a checkpoint is written at a sync point, so after loading one
    the loaded weights are the global copy. Without this, the next sync's pseudo-gradient
    would be taken against the weights from before the load.
    """
    impl._save_parameters()


def diloco_global_copies(impl: Any) -> List[Dict[str, torch.Tensor]]:
    """Every fragment's last global copy (name -> this rank's shard).

    What torchft lacks: the fragments (``_fragments``, of the private class
    ``_StreamingDiLoCoFragment``) are not exposed.

    Why monarch_ft needs it: the global copies must be bit-identical across groups after
    every sync. The step record's state hash covers them, which is how the supervisor
    checks that the groups agree.
    """
    return [dict(f.original_parameters) for f in impl._fragments]
