"""Periodic disk checkpoints through TorchTitan's own CheckpointManager (DCP), and what
makes one trustworthy: a manifest, verification before a load, quarantine, fallback.

Each replica group writes its own folder (``<run>/checkpoint/group_<g>``): a group's
checkpoints are that host's local files, so a node fault can take them away while
the other groups' copies survive. TorchFT healing does not need them; they are for
resuming a whole job from disk (``checkpoint.resume=true``) and for a group that
rejoins with no live peer left.

Inside a group folder (TorchTitan's names, and ours beside them)::

    step-N/                 one DCP save: shard files __<rank>_<k>.distcp, .metadata
    step-N/manifest.json    every file's size and xxh3-128 checksum, written last (complete)
    quarantine/step-N/      a copy that failed verification or failed to load, moved aside
    quarantine/step-N.reason.json   why, when, and by whom

A step is complete only once its manifest exists: DCP's ``.metadata`` says every shard
was written, not that the bytes are still the ones written. ``quarantine`` does not match
TorchTitan's ``step-(\\d+)`` search (its load-step lookup and its keep_latest_k purge list
the group folder only), so a quarantined copy is never loaded, counted or deleted by it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Optional

from monarch_ft.config import CheckpointConfig
from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import atomic_write, read_json
from monarch_ft.records.manifest import (
    _STEP_DIR,
    MANIFEST,
    QUARANTINE,
    build_manifest,
    complete_steps,
    describe_os_error,
    file_checksum,
    step_dir,
    verify_step_cached,
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


def save_failure_fix(errno_name: str) -> str:
    """What a user does about a save the storage refused, by its errno."""
    if errno_name in ("ENOSPC", "EDQUOT"):
        return "free space there, or point checkpoint.folder= at a filesystem with room"
    if errno_name in ("EROFS", "EACCES", "EPERM"):
        return "make it writable, or point checkpoint.folder= at a writable directory"
    return "check that storage, or point checkpoint.folder= elsewhere"


def folder_write_problem(folder: str) -> Optional[str]:
    """Why nothing can be written in ``folder`` (created if missing), or None.

    Writes and removes a small probe file: permission bits alone do not tell (root passes
    them, a read-only mount does not), and refusing a job before launch is one line, where
    finding out at the first save is every interval's failure. The folders it had to
    create are removed again: a job refused later, for another reason, leaves nothing."""
    folder = os.path.abspath(folder)
    created, parent = [], folder
    while not os.path.exists(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    probe = os.path.join(folder, f".monarch_ft-write-probe.{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
        os.remove(probe)
    except OSError as e:
        return describe_os_error(e)
    finally:
        for d in created:  # deepest first
            try:
                os.rmdir(d)
            except OSError:
                pass
    return None


# ---------------------------------------------------------------- quarantine, choice, alignment
def quarantine_step(path: str, reason: str, by: str) -> str:
    """Move the step directory ``path`` aside (never deleted), with why beside it; returns where.

    It goes to ``<group folder>/quarantine/step-N`` (``step-N.2``, ... if that step was
    quarantined before), out of every listing TorchTitan and :func:`complete_steps` make,
    and its reason to ``step-N.reason.json`` next to it. A rename: nothing is rewritten,
    so it works on a full disk (the reason file may then be missing; the event names it)."""
    folder, name = os.path.split(os.path.normpath(path))
    qdir = os.path.join(folder, QUARANTINE)
    os.makedirs(qdir, exist_ok=True)
    dest, n = os.path.join(qdir, name), 2
    while os.path.exists(dest):
        dest, n = os.path.join(qdir, f"{name}.{n}"), n + 1
    os.rename(path, dest)
    try:
        atomic_write(f"{dest}.reason.json", json.dumps({"from": path, "reason": reason, "by": by, "time": time.time()}, indent=1))
    except OSError:
        pass
    return dest


def quarantined(folder: str) -> list[tuple[str, dict]]:
    """The quarantined copies of a group folder: (path, its reason record or {})."""
    qdir = os.path.join(folder, QUARANTINE)
    if not os.path.isdir(qdir):
        return []
    out = []
    for name in sorted(os.listdir(qdir)):
        path = os.path.join(qdir, name)
        if os.path.isdir(path):
            try:
                out.append((path, read_json(f"{path}.reason.json", {}) or {}))
            except (OSError, ValueError):
                out.append((path, {}))
    return out


@dataclass(frozen=True)
class Damaged:
    """One group's copy of a step that failed verification."""

    step: int
    folder: str
    problem: str


@dataclass(frozen=True)
class ResumeChoice:
    """The step to resume from (None: no intact one), the folders holding an intact copy
    of it, and every copy found damaged on the way there."""

    step: Optional[int]
    intact: tuple[str, ...] = ()
    damaged: tuple[Damaged, ...] = ()


def choose_resume_step(
    steps: dict[str, Collection[int]],
    verify: Callable[[str, int], Optional[str]],
    at_most: Optional[int] = None,
    exclude: Collection[int] = (),
) -> ResumeChoice:
    """The newest step with an intact copy in some folder, newest first (the fallback).

    Every copy of each step tried is verified: a group loads its own folder's copy, so
    a damaged one must be found (and replaced by a copy of an intact one) even when
    another group's copy of the step is fine. A step with no intact copy anywhere is
    passed over for the next older one; the verification reads every byte, so it stops
    at the first step that has one.

    Args:
        steps: complete steps of each group folder (:func:`complete_steps`).
        verify: (folder, step) -> the problem with that copy, or None if intact.
        at_most: the job's committed step: newer steps (an older job's left in the same
            folders) are not this job's state.
        exclude: steps that failed to load in this job, whatever their manifest says.
    """
    candidates = sorted({s for have in steps.values() for s in have if (at_most is None or s <= at_most) and s not in exclude}, reverse=True)
    damaged: list[Damaged] = []
    for step in candidates:
        intact = []
        for folder, have in steps.items():
            if step in have:
                problem = verify(folder, step)
                if problem is None:
                    intact.append(folder)
                else:
                    damaged.append(Damaged(step, folder, problem))
        if intact:
            return ResumeChoice(step, tuple(intact), tuple(damaged))
    return ResumeChoice(None, (), tuple(damaged))


def _copy_files(source: str, dest: str) -> None:
    """``shutil.copytree`` without its error list: the first OSError (ENOSPC) is raised as
    itself, with its errno and file name, and the copy stops there."""
    os.makedirs(dest)
    for name in os.listdir(source):
        src = os.path.join(source, name)
        if os.path.isdir(src):
            _copy_files(src, os.path.join(dest, name))
        else:
            shutil.copy2(src, os.path.join(dest, name))


def copy_step(source: str, folder: str, step: int) -> str:
    """Copy the step directory ``source`` into ``folder`` as ``step-N``, whole or not at all.

    Copied under a name no lister takes for a step, then renamed: a copy cut short (a full
    disk) leaves nothing that looks like a checkpoint, and is removed."""
    os.makedirs(folder, exist_ok=True)
    incoming = os.path.join(folder, f".incoming-{step}")
    shutil.rmtree(incoming, ignore_errors=True)
    try:
        _copy_files(source, incoming)
        target = step_dir(folder, step)
        shutil.rmtree(target, ignore_errors=True)  # an unfinished save of that step
        os.rename(incoming, target)
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    return target


@dataclass
class Recovered:
    """What :func:`recover_checkpoint` did: the step, the directory each folder's group
    loads (its own copy, or an intact one elsewhere where copying failed), the copies it
    quarantined, and the copies it could not make."""

    step: Optional[int]
    paths: dict[str, str] = field(default_factory=dict)
    quarantined: list[dict] = field(default_factory=list)
    copy_failures: list[dict] = field(default_factory=list)


def recover_checkpoint(folders: list[str], at_most: Optional[int] = None, exclude: Collection[int] = (), verified: Optional[dict] = None) -> Recovered:
    """Make the newest intact step (not after ``at_most``, not in ``exclude``) loadable by
    every group: quarantine each damaged copy met on the way, and copy an intact one into
    every folder that lacks it, as each group would read it from shared storage.

    A copy that fails (a full disk) is cleaned up and that folder's group is pointed at
    the intact copy it would have received instead: the job resumes either way.
    ``verified``: a cache of recent verifications (:func:`verify_step_cached`).
    """
    steps = {folder: complete_steps(folder) for folder in folders}
    choice = choose_resume_step(steps, lambda folder, step: verify_step_cached(step_dir(folder, step), verified), at_most, exclude)
    result = Recovered(choice.step)
    for d in choice.damaged:
        record = {"step": d.step, "folder": d.folder, "problem": d.problem, "path": None}
        try:
            record["path"] = quarantine_step(step_dir(d.folder, d.step), d.problem, by="verified before a load")
        except OSError as e:
            record["error"] = describe_os_error(e)
        result.quarantined.append(record)
    if choice.step is None:
        return result
    source = step_dir(choice.intact[0], choice.step)
    for folder in folders:
        if folder in choice.intact:
            result.paths[folder] = step_dir(folder, choice.step)
            continue
        try:
            result.paths[folder] = copy_step(source, folder, choice.step)
        except OSError as e:
            result.paths[folder] = source
            result.copy_failures.append({"step": choice.step, "folder": folder, "source": source, "error": describe_os_error(e)})
    return result


# ---------------------------------------------------------------- writing: the rank's side
def _owned(name: str, rank: int) -> bool:
    """Whether ``rank`` wrote ``name``: DCP's FileSystemWriter names each rank's shard files
    ``__<rank>_<k>.distcp`` and its coordinator (rank 0) writes ``.metadata``."""
    return name.startswith(f"__{rank}_") or (rank == 0 and not name.startswith("__"))


def seal_step(path: str, step: int, metadata: Any) -> None:
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
    """
    import torch.distributed as dist

    expected = {info.relative_path for info in metadata.storage_data.values()} | {".metadata"}
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local: Any
    try:
        local = {name: file_checksum(os.path.join(path, name)) for name in expected if _owned(name, rank)}
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
            for part in parts:
                files.update(part)
            for name in expected - set(files):
                files[name] = file_checksum(os.path.join(path, name))
            write_manifest(path, build_manifest(step, files))
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
        from monarch_ft.records.exits import RankExit

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
        above."""

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
            seal_step(checkpoint_id, step, metadata)
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


def build_checkpointer(cfg: CheckpointConfig, run_dir: str, group: int, model, optimizers, lr_schedulers, states: dict, seed: int):
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
    return _sealed_manager()(
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


# ---------------------------------------------------------------- the job's view
class CheckpointHealth:
    """Failed saves, failed loads, quarantined copies and the newest good checkpoint, read
    off the job's events: the supervisor's progress line and ``summary.json``, and
    ``python -m monarch_ft status`` (from ``events.jsonl``), say the same thing."""

    def __init__(self) -> None:
        self.save_failures = 0
        self.save_failures_by_errno: dict[str, int] = {}
        self.last_save_failure: Optional[dict] = None
        # (group, step) -> when it was saved, less the copies quarantined since.
        self._good: dict[tuple, float] = {}
        self.load_failures: list[dict] = []
        self.quarantined: list[dict] = []
        self._load_failed_attempts: set = set()

    @classmethod
    def from_events(cls, events: Iterable[dict]) -> "CheckpointHealth":
        health = cls()
        for e in events:
            health.observe(e)
        return health

    def observe(self, e: dict) -> None:
        kind = e.get("event")
        if kind == EventKind.CHECKPOINT_SAVED:
            self._good[(e.get("group"), e.get("step"))] = e["time"]
        elif kind == EventKind.CHECKPOINT_SAVE_FAILED:
            self.save_failures += 1
            name = e.get("errno") or "?"
            self.save_failures_by_errno[name] = self.save_failures_by_errno.get(name, 0) + 1
            self.last_save_failure = {k: e.get(k) for k in ("time", "group", "step", "errno", "path", "error")}
        elif kind == EventKind.CHECKPOINT_LOAD_FAILED:
            key = (e.get("group"), e.get("attempt"))
            if key not in self._load_failed_attempts:  # every rank of the group reports it
                self._load_failed_attempts.add(key)
                self.load_failures.append({k: e.get(k) for k in ("time", "group", "attempt", "step", "path", "error")})
            # The job does not choose that step again, whichever copy: none of it is good.
            self._good = {k: t for k, t in self._good.items() if k[1] != e.get("step")}
        elif kind == EventKind.CHECKPOINT_QUARANTINED:
            self.quarantined.append({k: e.get(k) for k in ("time", "group", "step", "path", "problem")})
            self._good.pop((e.get("group"), e.get("step")), None)

    @property
    def newest_good(self) -> Optional[dict]:
        """The most recent save whose copy was not quarantined since: step, group, time."""
        if not self._good:
            return None
        (group, step), t = max(self._good.items(), key=lambda kv: kv[1])
        return {"step": step, "group": group, "time": t}

    def as_dict(self, now: float) -> dict[str, Any]:
        good = self.newest_good
        newest = dict(good, age_s=round(now - good["time"], 1)) if good else None
        return {
            "save_failures": self.save_failures,
            "save_failures_by_errno": self.save_failures_by_errno,
            "last_save_failure": self.last_save_failure,
            "newest_good": newest,
            "load_failures": self.load_failures,
            "quarantined": self.quarantined,
        }

    def describe(self, now: float) -> str:
        """One line: the newest good checkpoint and its age, failed saves, failed loads, quarantined copies."""
        good = self.newest_good
        parts = [f"newest good step {good['step']} ({now - good['time']:.0f}s ago)" if good else "no good checkpoint"]
        if self.save_failures:
            why = ", ".join(f"{n} {name}" for name, n in sorted(self.save_failures_by_errno.items()))
            parts.append(f"{self.save_failures} saves failed ({why})")
        if self.load_failures:
            parts.append(f"{len(self.load_failures)} loads failed")
        if self.quarantined:
            parts.append(f"{len(self.quarantined)} copies quarantined")
        return "; ".join(parts)
