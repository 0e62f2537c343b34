"""Periodic disk checkpoints through TorchTitan's own CheckpointManager (DCP): the rank's side.

Each replica group writes its own folder (``<run>/checkpoint/group_<g>``): a group's
checkpoints are that host's local files, so a node fault can take them away while
the other groups' copies survive. TorchFT healing does not need them; they are for
resuming a whole job from disk (``checkpoint.resume=true``) and for a group that
rejoins with no live peer left.

Every save is sealed by a manifest once DCP has written it (:func:`seal_step`; the format:
:mod:`monarch_ft.records.manifest`), bounded by a watchdog (:class:`SaveWatchdog`), and a
save the storage refused is told from a bug (:func:`storage_error`). Which step a group
loads, and what is quarantined, is the controller's decision
(:mod:`monarch_ft.controller.checkpoints`).
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from monarch_ft.config.checkpoint import CheckpointConfig
from monarch_ft.records.events import EventKind
from monarch_ft.records.exits import RankExit
from monarch_ft.records.manifest import (
    _STEP_DIR,
    MANIFEST,
    build_manifest,
    describe_os_error,
    file_checksum,
    write_manifest,
)

# ---------------------------------------------------------------- failures


def storage_error(exc: BaseException) -> Optional[OSError]:
    """The storage's refusal behind a failed save, or None when something else failed.

    A save that raises an OSError of any errno (ENOSPC, EDQUOT, EIO, EROFS, EACCES, ...)
    was refused by the storage, which is outside the job: the live replicas still hold the
    state, so it is a recoverable event. DCP gathers every rank's write result to its
    coordinator and raises one ``CheckpointException`` on every rank of the group (the
    same failures, each with its rank), so every rank of a group reaches the same verdict
    at the same point; it counts as the storage's only if every failure in it is an
    OSError (or was raised while handling one, as torch's zip stream writer does on a
    short write). Anything else (a bug, a peer gone from the collective) is not caught."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, CheckpointException):
        found = [storage_error(e) for e, _tb in exc.failures.values()]
        if found and all(e is not None for e in found):
            return found[0]
        return None
    return _os_error_behind(exc)


def _os_error_behind(exc: BaseException) -> Optional[OSError]:
    """The OSError an exception was raised from or while handling (its cause or context chain)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def describe_error(exc: BaseException) -> str:
    """One line for an exception, a ``CheckpointException`` by its ranks' own errors."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, CheckpointException):
        parts = [f"rank {rank}: {describe_error(e)}" for rank, (e, _tb) in sorted(exc.failures.items())]
        return "; ".join(parts)[:800]
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {describe_os_error(exc)}" + (f": {exc.filename}" if exc.filename else "")
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:800] if text else type(exc).__name__


# ---------------------------------------------------------------- writing: the rank's side
def _owned(name: str, rank: int) -> bool:
    """Whether ``rank`` wrote ``name``: DCP's FileSystemWriter names each rank's shard files
    ``__<rank>_<k>.distcp`` and its coordinator (rank 0) writes ``.metadata``."""
    return name.startswith(f"__{rank}_") or (rank == 0 and not name.startswith("__"))


def seal_step(path: str, step: int, metadata: Any, fingerprint: Optional[str] = None) -> None:
    """Write ``path``'s manifest once DCP has saved it: the step is complete from then on.

    A collective over the group's process group (the one DCP saved over), on every rank:
    each rank checksums the files it wrote itself (no rank reads back another's files,
    which may sit on another host's disk), rank 0 gathers them, checksums anything no rank
    claimed, and writes the manifest; then every rank learns the outcome, so a manifest
    that could not be written (the disk filled up meanwhile) fails the save on every rank
    alike, as DCP's own failures do.

    Args:
        path: the step directory.
        step: its step.
        metadata: what ``dcp.save`` returned (every rank gets the global one): its storage
            entries name every file of the step.
        fingerprint: this rank's digest of the state it saved (rank.components.integrity),
            gathered into the manifest per rank; None: none.
    """
    import torch.distributed as dist

    expected = {info.relative_path for info in metadata.storage_data.values()} | {".metadata"}
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local: Any
    try:
        local = ({name: file_checksum(os.path.join(path, name)) for name in expected if _owned(name, rank)}, fingerprint)
    except OSError as e:
        local = e
    parts: list[Any] = [local]
    if distributed:
        parts = [None] * world if rank == 0 else []
        dist.gather_object(local, parts if rank == 0 else None, dst=0)
    outcome: Optional[BaseException] = None
    if rank == 0:
        try:
            errors = [p for p in parts if isinstance(p, BaseException)]
            if errors:
                raise errors[0]
            files: dict[str, tuple[int, str]] = {}
            fingerprints: dict[int, str] = {}
            for r, (part, digest) in enumerate(parts):
                files.update(part)
                if digest is not None:
                    fingerprints[r] = digest
            for name in expected - set(files):
                files[name] = file_checksum(os.path.join(path, name))
            write_manifest(path, build_manifest(step, files, fingerprints if len(fingerprints) == len(parts) else None))
        except OSError as e:
            outcome = e
    if distributed:
        box = [outcome]
        dist.broadcast_object_list(box, src=0)
        outcome = box[0]
    if outcome is not None:
        raise outcome


def remove_partial(path: str) -> bool:
    """Remove what a failed save left of its step: it frees the space it took, and it can
    never be mistaken for a checkpoint. Older steps are left alone. False if it could not."""
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


class SaveWatchdog:
    """Bounds a checkpoint save and tells the supervisor while one runs.

    A save reports nothing until it ends, so the rank says when it enters and leaves one
    (``checkpoint_save_started`` / ``checkpoint_saved``) and the supervisor's hang detector
    allows it ``timeout_s`` instead of ``ft.hang_timeout_s``. A save still running after
    ``timeout_s`` is stuck, not slow: the watchdog writes every thread's stack to
    ``stacks_path``, reports ``checkpoint_save_timeout`` and ends the rank with
    ``RankExit.SAVE_TIMEOUT``, so the failure is named and its cause is on disk. A save
    that raises reports no ``checkpoint_saved`` (the exception goes on to the caller).

    Args:
        timeout_s: ``checkpoint.save_timeout_s``.
        report: the rank reporter's ``event``.
        stacks_path: where the stacks go on a timeout.
        on_timeout: what ends the rank (``os._exit`` by default; tests pass their own).
    """

    def __init__(self, timeout_s: float, report: Callable[..., None], stacks_path: str, on_timeout: Optional[Callable[[int], None]] = None) -> None:
        self.timeout_s = timeout_s
        self._report = report
        self.stacks_path = stacks_path
        self._on_timeout = on_timeout or os._exit

    def _expired(self, step: int, started: float) -> None:
        os.makedirs(os.path.dirname(self.stacks_path), exist_ok=True)
        with open(self.stacks_path, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        self._report(EventKind.CHECKPOINT_SAVE_TIMEOUT, step=step, seconds=round(time.time() - started, 3), timeout_s=self.timeout_s, stacks=self.stacks_path)
        self._on_timeout(int(RankExit.SAVE_TIMEOUT))

    @contextmanager
    def guard(self, step: int) -> Iterator[None]:
        started = time.time()
        self._report(EventKind.CHECKPOINT_SAVE_STARTED, step=step, timeout_s=self.timeout_s)
        timer = threading.Timer(self.timeout_s, self._expired, args=(step, started))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        self._report(EventKind.CHECKPOINT_SAVED, step=step, seconds=round(time.time() - started, 3))


def save_due(step: int, interval: int, last_step: bool) -> bool:
    """Whether TorchTitan's CheckpointManager.save will write at ``step`` (its own rule)."""
    return last_step or step % interval == 0


class TrainState:
    """Steps trained, saved beside the model so a resumed job knows where it is."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class DataCursor:
    """The data order is a pure function of (seed, step, group, rank): only the seed is state."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was written with training.seed={state['seed']}, this run has {self.seed}")


_SEALED: Optional[type] = None


def _sealed_manager() -> type:
    """TorchTitan's CheckpointManager whose every save ends with a manifest (built on first
    use: the controller imports this module and must not import torch)."""
    global _SEALED
    if _SEALED is not None:
        return _SEALED
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torchtitan.components.checkpoint import AsyncMode, CheckpointManager
    from torchtitan.tools.utils import GarbageCollection

    class StorageErrorWriter(FileSystemWriter):
        """DCP's own file writer (the one ``dcp.save`` builds for a path), raising the
        storage's OSError as itself. torch's zip stream writer turns a failed write (ENOSPC)
        into ``RuntimeError: ... unexpected pos`` with the OSError only as its context, and
        DCP pickles each rank's failure to every rank, which drops the context: re-raised
        as the OSError, every rank of the group learns the errno (storage_error)."""

        def write_data(self, plan, planner):
            try:
                return super().write_data(plan, planner)
            except RuntimeError as e:
                cause = _os_error_behind(e)
                if cause is None:
                    raise
                raise cause from None  # its own traceback says where the write failed

    class SealedCheckpointManager(CheckpointManager):
        """Every DCP save is sealed by a manifest before TorchTitan's keep_latest_k purge
        runs (``save`` purges after ``dcp_save`` returns), so a step only counts toward the
        kept ones once it is complete. Synchronous saves only (``async_mode=disabled``, as
        :func:`build_checkpointer` configures): an async save's files are not written yet
        when ``dcp_save`` returns. The save itself is TorchTitan's synchronous DCP path
        (``dcp.save`` of the state to the step directory, then its GC), with the writer
        above. ``fingerprint``: returns this rank's digest of the state being saved
        (rank.components.integrity), sealed into the manifest; None: none."""

        fingerprint: Optional[Callable[[], str]] = None

        def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):
            if async_mode != AsyncMode.DISABLED or to_hf:
                raise ValueError("monarch_ft seals synchronous DCP saves only (checkpoint async_mode=disabled, no HF export)")
            step = int(_STEP_DIR.match(os.path.basename(os.path.normpath(checkpoint_id))).group(1))
            if dist.get_rank() == 0:
                # A manifest left by an earlier save of this step must not vouch for files
                # about to be rewritten; DCP's first collective orders this before any write.
                try:
                    os.remove(os.path.join(checkpoint_id, MANIFEST))
                except FileNotFoundError:
                    pass
            metadata = dcp.save(state_dict, storage_writer=StorageErrorWriter(checkpoint_id))
            # The state is the one just written: nothing steps between the save and the seal.
            fingerprint = self.fingerprint() if self.fingerprint is not None else None
            seal_step(checkpoint_id, step, metadata, fingerprint)
            if enable_garbage_collection:
                GarbageCollection.collect("GC collection invoked by checkpointer.")
            return metadata

        def load_path(self, step: int, path: Optional[str]) -> bool:
            """Load ``step`` from ``path`` (the step directory the controller verified), or from
            this group's own folder when ``path`` is None or that folder's copy. Another
            group's copy is read where copying it here failed (a full disk)."""
            if path is None or os.path.abspath(path) == os.path.abspath(self._create_checkpoint_id(step)):
                return self.load(step=step)
            self.dcp_load(self._states_to_load(model_only=False), checkpoint_id=path, from_hf=False, from_quantized=False)
            return True

    _SEALED = SealedCheckpointManager
    return _SEALED


def build_checkpointer(
    cfg: CheckpointConfig, run_dir: str, group: int, model, optimizers, lr_schedulers, states: dict, seed: int, fingerprint: Optional[Callable[[], str]] = None
):
    """TorchTitan's CheckpointManager, sealing each save (``fingerprint``: see SealedCheckpointManager)."""
    from torchtitan.config.job_config import Checkpoint

    tt_cfg = Checkpoint(
        enable=cfg.enable,
        folder=f"group_{group}",
        interval=cfg.interval,
        keep_latest_k=cfg.keep_latest_k,
        async_mode="disabled",
        # The last save keeps optimizer state too, so a job can resume from it.
        last_save_model_only=False,
        enable_ft_dataloader_checkpoints=False,
    )
    manager = _sealed_manager()(
        dataloader=DataCursor(seed),
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states=states,
        checkpoint_config=tt_cfg,
        sd_adapter=None,
        base_folder=os.path.join(run_dir, cfg.folder),
        ft_manager=None,
    )
    manager.fingerprint = fingerprint
    return manager
