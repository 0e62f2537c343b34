"""The controller's side of disk checkpoints: which step the job resumes from, quarantine,
fallback, and the job's checkpoint health.

The ranks save (``monarch_ft.rank.components.checkpoint``) and seal each step with a
manifest (:mod:`monarch_ft.records.manifest`). When the job's state must come from disk
(``checkpoint.resume``, a full restart, no live peer left), the controller picks the newest
step with an intact copy (:func:`choose_resume_step`), moves each damaged copy it meets
aside (:func:`quarantine_step`: never deleted) and copies an intact one into every group
folder that lacks it (:func:`recover_checkpoint`), as each group would read it from shared
storage. :class:`CheckpointHealth` reads failed saves and loads and quarantined copies off
the job's events, for the progress line, ``summary.json`` and ``python -m monarch_ft status``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Optional

from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import atomic_write, read_json
from monarch_ft.records.manifest import QUARANTINE, complete_steps, describe_os_error, manifest_fingerprint, step_dir, verify_step_cached

# (step, each rank's state digest in its manifest) -> what is wrong with that state, or None.
Vouch = Callable[[int, dict], Optional[str]]


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


def verify_copy(folder: str, step: int, verified: Optional[dict] = None, vouch: Optional[Vouch] = None) -> Optional[str]:
    """What is wrong with one group's copy of ``step``: its files against its manifest
    (``verified``: a cache, see verify_step_cached), then the state its manifest's fingerprint
    vouches for against the state the replicas agreed on at that step (``vouch``:
    controller.integrity.IntegrityJudge.vouch); None when both hold."""
    path = step_dir(folder, step)
    problem = verify_step_cached(path, verified)
    if problem is None and vouch is not None:
        problem = vouch(step, manifest_fingerprint(path))
    return problem


def recover_checkpoint(
    folders: list[str], at_most: Optional[int] = None, exclude: Collection[int] = (), verified: Optional[dict] = None, vouch: Optional[Vouch] = None
) -> Recovered:
    """Make the newest intact step (not after ``at_most``, not in ``exclude``) loadable by
    every group: quarantine each damaged copy met on the way, and copy an intact one into
    every folder that lacks it, as each group would read it from shared storage.

    A copy that fails (a full disk) is cleaned up and that folder's group is pointed at
    the intact copy it would have received instead: the job resumes either way.
    ``verified``: a cache of recent verifications (:func:`verify_step_cached`); ``vouch``: see
    :func:`verify_copy` (a copy whose bytes match its manifest but whose state the replicas never
    agreed on is damaged too).
    """
    steps = {folder: complete_steps(folder) for folder in folders}
    choice = choose_resume_step(steps, lambda folder, step: verify_copy(folder, step, verified, vouch), at_most, exclude)
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


class CheckpointScrub:
    """``checkpoint.scrub_every_s``: every kept step of every group read back, in a background
    thread, against its manifest and the replicas' agreed fingerprint (:func:`verify_copy`).

    Bytes on disk rot without a write (their mtime unchanged), so it reads every byte each
    time rather than trusting a verification it made before. A step a rank's keep_latest_k
    purge removes while it is read looks damaged: a copy is reported only if it is still there
    and still damaged when read a second time. What it finds goes to the watch loop
    (:meth:`results`), which quarantines it; the thread only reads.

    Args:
        every_s: seconds between passes (0: none).
        folders: the group folders now.
        vouch: see :func:`verify_copy`.
    """

    RECHECK_S = 0.5

    def __init__(self, every_s: float, folders: Callable[[], list[str]], vouch: Optional[Vouch] = None) -> None:
        self.every_s, self._folders, self._vouch = every_s, folders, vouch
        self._found: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def results(self) -> list[dict]:
        """The passes finished since the last call: {steps, seconds, damaged: [{folder, step, problem}]}.
        Starts the thread on the first call (the watch loop's)."""
        if self.every_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="checkpoint-scrub", daemon=True)
            self._thread.start()
        with self._lock:
            found, self._found = self._found, []
        return found

    def scrub_once(self) -> dict:
        """One pass over every kept step of every folder."""
        start, checked, damaged = time.time(), 0, []
        for folder in self._folders():
            for step in sorted(complete_steps(folder)):
                if self._stop.is_set():
                    break
                checked += 1
                problem = verify_copy(folder, step, None, self._vouch)
                if problem is None:
                    continue
                time.sleep(self.RECHECK_S)
                if step in complete_steps(folder) and verify_copy(folder, step, None, self._vouch) is not None:
                    damaged.append({"folder": folder, "step": step, "problem": problem})
        return {"steps": checked, "seconds": round(time.time() - start, 3), "damaged": damaged}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            found = self.scrub_once()
            if found["damaged"] or found["steps"]:
                with self._lock:
                    self._found.append(found)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


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
