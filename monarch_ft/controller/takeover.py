"""The job outlives its controller: the run-dir lock, the takeover state, attach and detach.

One controller driving the whole job is the Monarch idea, and its weak spot: if the
process dies (a laptop sleeps, an OOM, a SIGKILL), the job must not die with it. So:

- The ranks and the Lighthouse are not tied to the supervisor's life (no
  ``PR_SET_PDEATHSIG``). The supervisor keeps the whole job state
  (:class:`~monarch_ft.controller.state.JobState`: the job's config, every live rank's pid
  *and* process start time, report-file offsets consumed, restart counts, the job's
  committed step, ...) on disk: what changed is appended to ``controller.journal``, and
  ``controller.json`` is rewritten whole only when the journal has grown past it
  (:mod:`monarch_ft.records.journal`: a base and a redo log). A SIGKILL at any instant leaves
  a state a new controller can take over (a torn last journal line is the save that never
  happened). A tick that decided anything saves at its end; one that only took the ranks'
  records in leaves its save to a tick that read no step, from :data:`PROGRESS_SAVE_S` after
  the last save, or at the latest :data:`PROGRESS_SAVE_MAX_S` (:func:`progress_only`,
  :func:`progress_save_due`): a new
  controller reads those records again from the saved offsets, takes them in, and relays
  none a second time (:class:`ResumedTail`).
- ``controller.attach=true`` takes the job over (:meth:`Takeover.load` and
  :meth:`Takeover.adopt`, applied by ``Supervisor``): every
  recorded rank is checked to be the *same process* (pid and start time: a reused pid is
  a different process), live groups are re-adopted as they are, a group with a rank gone
  is failed (the normal restart path), reports are read on from the saved offsets, and
  ``controller_lost`` / ``controller_attached`` (with how long the job ran unsupervised)
  go to the same ``events.jsonl``.
- ``controller.lock`` (fcntl) is held by the live controller: a second one on the same
  run directory is refused with one line.
- SIGUSR2 (or ``kill -USR2 <supervisor pid>``) detaches: the controller exits and leaves
  the job running; Ctrl-C / SIGTERM still stop the whole job.
- A heartbeat file (``control/controller``) is the ranks' lease
  (:mod:`monarch_ft.records.lease`): ranks never reattached end the job themselves
  after ``controller.lease_s`` with a checkpoint.

The pure decisions (is it the same process, what to do with a recorded group, has the
lease run out) are functions here, apart from the supervisor's loop that applies them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import threading
from typing import Any, Iterable, Optional

from monarch_ft.common.clock import SYSTEM_CLOCK, Clock
from monarch_ft.common.process import ProcessIdentity
from monarch_ft.config.controller import ControllerConfig
from monarch_ft.controller.actions import Emit, WriteFloor, WriteMetrics
from monarch_ft.controller.snapshot import RecordMirror, from_record, to_record
from monarch_ft.controller.state import STATE_VERSION, GroupState, JobState
from monarch_ft.launcher.base import Launcher, RankProcess
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GroupStatus, StrEnum
from monarch_ft.records.journal import StateJournal, StateReader, diff
from monarch_ft.records.layout import RunLayout, atomic_write
from monarch_ft.records.lease import heartbeat_time
from monarch_ft.records.report_records import ReportRecord, parse_record
from monarch_ft.records.reports import ReportTail, read_records, tail_records

# The documented detach signal: the controller exits, the job keeps training.
DETACH_SIGNAL = signal.SIGUSR2
# Exit code of a controller that detached on request (the job is still running).
DETACHED_EXIT = 0
# Set (to anything but "" or "0"): every save checks the incrementally kept state against the
# whole snapshot and raises on a difference (the test suites set it: tests/conftest.py).
VERIFY_STATE_ENV = "MONARCH_FT_VERIFY_TAKEOVER_STATE"
# The verify mode also reads the takeover state whole (as a new controller does) every so many checks.
FULL_READ_EVERY = 32
# An adopted rank (not this controller's child) has no exit status to read: one that
# is gone without having reported rank_finished is taken for a crash with this code.
LOST_EXIT = 255


# ---------------------------------------------------------------- pure decisions


class AttachAction(StrEnum):
    """What a new controller does with one recorded group."""

    ADOPT = "adopt"  # every rank is the same live process: watch it as if launched here
    FAIL = "fail"  # a rank is gone (or was replaced): fail the group, restart as usual
    KEEP = "keep"  # nothing running to adopt (waiting for its relaunch, done, given up)


def decide_attach(status: str, ranks_alive: list[bool], ranks_exited: list[Optional[int]]) -> AttachAction:
    """Args:
    status: the group's recorded :class:`GroupStatus`.
    ranks_alive: per recorded rank, whether it is still the same live process.
    ranks_exited: per recorded rank, the exit code the previous controller saw (None: running).
    """
    if status not in (GroupStatus.STARTING, GroupStatus.RUNNING) or not ranks_alive:
        return AttachAction.KEEP
    if all(alive or exited == 0 for alive, exited in zip(ranks_alive, ranks_exited)):
        return AttachAction.ADOPT
    return AttachAction.FAIL


# ---------------------------------------------------------------- the run-dir lock
class RunLock:
    """An fcntl lock on ``controller.lock``: held by the live controller for its life, so
    the kernel drops it whenever the controller dies (SIGKILL included).

    Args:
        path: the lock file (RunLayout.controller_lock).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            run_dir = os.path.dirname(self.path)
            raise ConfigError(
                f"another controller (pid {holder}) is supervising {run_dir}: stop it (python -m monarch_ft stop {run_dir}) "
                f"or detach it (kill -USR2 {holder}) first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def controller_attached(layout: RunLayout) -> Optional[int]:
    """The pid of the controller holding ``layout``'s lock now, or None (none attached)."""
    try:
        fd = os.open(layout.controller_lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the takeover state
class Takeover:
    """The controller's side of attach, detach, the lock, the heartbeat and ``controller.json``.

    It works on the job's :class:`~monarch_ft.controller.state.JobState`, whole: :meth:`save`
    writes what changed of its snapshot (:mod:`monarch_ft.controller.snapshot`'s
    :class:`~monarch_ft.controller.snapshot.RecordMirror`, into :mod:`monarch_ft.records.journal`),
    :meth:`load` reads it back,
    :meth:`adopt` rebuilds the live handles (each rank's process and report tail) and says
    what to do with each recorded group. The loop calls it at a few points: :meth:`open`
    (before touching the run directory), :meth:`load`/:meth:`adopt`/:meth:`lost` (instead of
    starting a job, or to close out a job that ended without one), :meth:`tick` and
    :meth:`save` (every watch tick), and :meth:`close` (at the end, detached or not).

    Args:
        cfg: the ``controller`` section.
        layout: the run directory's paths.
        clock: the controller's clock (its heartbeat's time).
    """

    def __init__(self, cfg: ControllerConfig, layout: RunLayout, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self.layout = layout
        self.clock = clock
        self.lock = RunLock(self.layout.controller_lock)
        self.attaching = bool(self.cfg.attach)
        self.detach_requested = False
        self._identities: dict[int, Optional[ProcessIdentity]] = {}
        self._last_beat = 0.0
        # The record last written, and its files (a base and a journal of what changed since).
        self.mirror = RecordMirror(JobState)
        self.journal = StateJournal(self.layout.controller_state, self.layout.controller_journal)
        self.verify = os.environ.get(VERIFY_STATE_ENV, "") not in ("", "0")
        # The verify mode's reader of what was saved: incremental (a whole read per save made
        # the check quadratic in a job's ticks); every FULL_READ_EVERY-th check reads it whole too.
        self._reader = StateReader(self.layout.controller_state, self.layout.controller_journal)
        self._checks = 0
        self._beat_stop = threading.Event()
        self._beat_thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Take the run directory's lock; refuse attaching to a run with no takeover state
        (or one another version of its state format wrote, or a job that has finished)."""
        self.lock.acquire()
        if self.attaching:
            state = self.layout.read_controller_state()
            problem = None
            if not state:
                problem = f"controller.attach=true but {self.layout.run_dir} has no controller.json: no job was started there"
            elif state.get("finished"):
                problem = f"the job in {self.layout.run_dir} has already finished ({state.get('status')}): nothing to attach to"
            elif state.get("version") != STATE_VERSION:
                problem = (
                    f"{self.layout.controller_state} was written by another version of monarch_ft (state version {state.get('version')}, "
                    f"this one reads {STATE_VERSION}): take the job over with the version that started it"
                )
            if problem:
                self.lock.release()
                raise ConfigError(problem)

    def request_detach(self) -> None:
        """Safe from a signal handler."""
        self.detach_requested = True

    def clear_detach(self) -> None:
        """A detach refused (no controller could take the job over): the request is dropped."""
        self.detach_requested = False

    @staticmethod
    def attach_config(cfg, run_dir: str):
        """The job's own config (saved by the first controller) with this command line's
        ``controller`` section: a takeover must not change the job it takes over."""
        state = RunLayout(run_dir).read_controller_state()
        if not cfg.controller.attach or not state or not state.get("config"):
            return cfg
        from omegaconf import OmegaConf

        # Only this recipe's sections (a drill's run attached by pretrain.py has no chaos to run).
        known = {f.name for f in dataclasses.fields(type(cfg))} - {"controller"}
        saved = {k: v for k, v in state["config"].items() if k in known}
        merged = OmegaConf.merge(OmegaConf.structured(type(cfg)), saved)
        job = OmegaConf.to_object(merged)
        job.controller = cfg.controller
        return job

    def heartbeat(self, now: float, force: bool = False) -> None:
        if force or now - self._last_beat >= self.cfg.heartbeat_s:
            atomic_write(self.layout.controller_heartbeat, json.dumps({"pid": os.getpid(), "time": now}))
            self._last_beat = now

    def start_heartbeat(self) -> None:
        """Refresh the heartbeat from a thread of its own: the watch loop blocks for seconds
        at times (starting the Lighthouse, preparing data, stopping a group), and the lease
        is about the controller being gone, not busy. It stops with the process (SIGKILL,
        SIGSTOP) or at :meth:`close`."""
        self.heartbeat(self.clock.time(), force=True)

        def beat() -> None:
            while not self._beat_stop.wait(self.cfg.heartbeat_s):
                try:
                    self.heartbeat(self.clock.time(), force=True)
                except OSError:
                    pass

        self._beat_thread = threading.Thread(target=beat, name="controller-heartbeat", daemon=True)
        self._beat_thread.start()

    def close(self, state: JobState, events: EventLog, finished: bool) -> None:
        """At the end: a finished job marks its state so, a detached one leaves it for the next controller."""
        self._beat_stop.set()
        try:
            if finished:
                self.save(state, finished=True)
            else:
                self.save(state)
                events.emit(EventKind.CONTROLLER_DETACHED, pid=os.getpid())
        finally:
            self.journal.close()
            self.lock.release()

    # ------------------------------------------------------------ the state file
    def identity(self, proc: RankProcess) -> Optional[ProcessIdentity]:
        """The rank's identity, read once (at its first save, right after launch)."""
        key = id(proc)
        if self._identities.get(key) is None:
            # Not known yet is asked again: a Slurm rank's pid is known once its job runs.
            ident = getattr(proc, "identity", None)
            self._identities[key] = ident if isinstance(ident, ProcessIdentity) else ProcessIdentity.of(proc.pid)
        return self._identities[key]

    def snapshot(self, state: JobState, finished: bool = False) -> dict[str, Any]:
        """The takeover state's content, whole: the job state (the live handles' identities
        mirrored into it first), with the file's version and the writing controller."""
        self._mirror_handles(state, None)
        return {**self._file_fields(finished), **to_record(state)}

    def _file_fields(self, finished: bool) -> dict[str, Any]:
        return {"version": STATE_VERSION, "finished": finished, "controller_pid": os.getpid()}

    def _mirror_handles(self, state: JobState, groups: Optional[set[int]]) -> None:
        for g in state.groups:
            if groups is not None and g.index not in groups:
                continue
            for rs in g.ranks:
                if rs.proc is None:
                    continue
                if rs.exited is None and rs.pid is not None:
                    rs.mirror_offset()  # its identity is mirrored and holds while it runs
                else:
                    rs.mirror(self.identity(rs.proc) if rs.exited is None else None)

    def save(self, state: JobState, finished: bool = False, groups: Optional[Iterable[int]] = None, partial: bool = False) -> None:
        """Write what changed since the last save: one journal line (nothing when nothing
        changed), or a new base (the first save, a finished job, a journal grown past the
        base). A SIGKILL at any instant leaves the last save's state or this one's.

        Raises OSError when the state cannot be written (ENOSPC, EROFS, ...): the next save
        then writes a new base, with everything changed meanwhile.

        Args:
            state: the job's state.
            finished: the job has ended (the state is marked so; a takeover is refused).
            groups: the indices of the groups that may have changed since the last save (a
                tick that knows them spares encoding the others); None: any group may have.
            partial: other groups may have changed too, and a later save writes them (a launch
                saves its new ranks' pids at once, mid-pass, without encoding every group).
        """
        changed = None if groups is None else set(groups)
        self._mirror_handles(state, changed)
        ops = self.mirror.update(state, changed)
        files = self._file_fields(finished)
        for key, value in files.items():
            if self.mirror.record.get(key, None) != value:
                if key in self.mirror.record:
                    ops.append([[key], value])
                self.mirror.record[key] = value
        if finished or self.journal.needs_compaction():
            self.journal.write_base(self.mirror.record)
        elif ops:
            self.journal.append(ops)
        if self.verify:
            self.check(state, finished, only=changed if partial else None)

    def check(self, state: JobState, finished: bool = False, only: Optional[set[int]] = None) -> None:
        """Raise AssertionError naming the first path where the takeover state on disk (the base
        and its journal, as a new controller reads them) differs from the whole snapshot of
        ``state``: a change :meth:`save` was not told of (``groups``), or a rank's record
        changed in place (:class:`~monarch_ft.controller.snapshot.RecordMirror`). What the test
        suites turn on for every save (:data:`VERIFY_STATE_ENV`).

        Args:
            state: the job's state, as just saved.
            finished: as just saved.
            only: after a partial save, these groups are checked (the rest is written later).
        """
        on_disk = self._reader.read() or {}
        self._checks += 1
        if finished or self._checks % FULL_READ_EVERY == 0:
            whole_read = self.layout.read_controller_state() or {}
            if whole_read != on_disk:
                raise AssertionError(f"the takeover state read incrementally differs from a whole read at {diff(whole_read, on_disk)[0][0]}")
        whole = json.loads(json.dumps(self.snapshot(state, finished), default=str))
        if only is not None:
            on_disk = {"groups": [on_disk.get("groups", [])[i] for i in sorted(only)]}
            whole = {"groups": [whole["groups"][i] for i in sorted(only)]}
        missed = diff(on_disk, whole)
        if missed:
            raise AssertionError(
                f"the takeover state on disk is out of date at {missed[0][0]} ({len(missed)} paths): "
                "a change the save was not told of, or a record changed in place"
            )

    def state_bytes(self) -> int:
        """The takeover state's bytes on disk now (its base and its journal)."""
        return self.journal.size()

    def load(self) -> tuple[JobState, dict]:
        """The job's state as the previous controller saved it (no live handle yet: :meth:`adopt`),
        and the file's own fields (``controller_pid``)."""
        record = self.layout.read_controller_state() or {}
        state = from_record(JobState, {k: v for k, v in record.items() if k not in _FILE_FIELDS})
        return state, {k: record.get(k) for k in _FILE_FIELDS}

    # ------------------------------------------------------------ takeover
    def adopt(self, state: JobState, launcher: Launcher, relayed: set[tuple], now: float) -> tuple[dict[int, str], list[tuple[GroupState, list[int]]]]:
        """Rebuild each recorded rank's live handles (its process, by the launcher's handle or
        its pid and start time; its report, read on from the saved offset) and judge each
        group (:func:`decide_attach`). No event, no action yet: the loop applies it.

        Returns each group's :class:`AttachAction`, and the groups to fail with their lost ranks."""
        launcher.restore_handles(state.launcher_handles or {})
        decisions: dict[int, str] = {}
        failed = []
        for g in state.groups:
            alive, exited = [], []
            for rs in g.ranks:
                launch = rs.launch.launch()
                ident = ProcessIdentity(rs.pid, rs.start) if rs.pid else None
                report = self.layout.report(launch.group, launch.rank, launch.attempt)
                # By the launcher's own handle (a Slurm job id), else by pid and start time.
                rs.proc = launcher.adopt(launch, ident or ProcessIdentity(0, None), report)
                rs.tail = ResumedTail(report, relayed)
                rs.tail.seek(rs.report_offset)
                # Silence and phase clocks restart now: the time unwatched is not the rank's.
                rs.last_progress = rs.phase_seen = now
                # A rank that ended while unsupervised: with 0 it finished (not a failure).
                code = rs.proc.poll() if rs.exited is None else rs.exited
                alive.append(code is None)
                exited.append(code)
            action = decide_attach(g.status, alive, exited)
            decisions[g.index] = action.value
            if action is AttachAction.FAIL:
                failed.append((g, [rs.rank for rs, a, e in zip(g.ranks, alive, exited) if not a and e != 0]))
            if g.status == GroupStatus.WAITING:
                g.plan = dataclasses.replace(g.plan, at=now)
        return decisions, failed

    def lost(self, events: EventLog, previous_pid: Optional[int], job_step: int, now: float) -> dict:
        """Record ``controller_lost`` at the previous controller's last heartbeat."""
        last_beat = heartbeat_time(self.layout.controller_heartbeat) or now
        return events.emit(EventKind.CONTROLLER_LOST, time=last_beat, pid=previous_pid, job_step=job_step)

    # ------------------------------------------------------------ summary
    def summary(self, events: list[dict], ended_by: Optional[str], now: float) -> dict[str, Any]:
        """summary.json's ``controller`` section: the job's controllers and each span it ran
        without one (from controller_lost to the next controller_attached, or to the job's
        end when its lease ended it), with the steps committed meanwhile."""
        spans = []
        for i, e in enumerate(events):
            if e["event"] != EventKind.CONTROLLER_LOST:
                continue
            back = next((x for x in events[i + 1 :] if x["event"] == EventKind.CONTROLLER_ATTACHED), None)
            until = back["time"] if back else now
            ended = "controller_attached" if back else ended_by
            seconds = back["unsupervised_s"] if back and "unsupervised_s" in back else round(until - e["time"], 3)
            spans.append({"from": e["time"], "until": until, "seconds": seconds, "ended_by": ended})
        if spans:
            steps = committed_steps(self.layout.metrics, [(s["from"], s["until"]) for s in spans])
            for span, n in zip(spans, steps):
                span["steps_committed"] = n
        return {
            "controllers": 1 + sum(1 for e in events if e["event"] == EventKind.CONTROLLER_ATTACHED),
            "unsupervised_s": round(sum(s["seconds"] for s in spans), 3),
            "unsupervised": spans,
            "ended_by_lease": ended_by == "lease_expired",
        }


# A tick that only took the ranks' records in leaves its save to a later tick: from this long
# after the last save, a tick that read no step saves (progress_save_due). A save per tick was a quarter
# of the tick's CPU at 1,024 groups (each group's steps encoded at each step); over this, a
# group's several steps are one change. What a SIGKILL costs: a new controller reads up to
# PROGRESS_SAVE_MAX_S of the reports again (ResumedTail), well inside the METRICS_LOOK_BACK of
# metrics.jsonl that relayed_records looks back over (about 3 MB a second at 1,024 groups).
PROGRESS_SAVE_S = 0.5
# ... and from this long after it, any tick saves.
PROGRESS_SAVE_MAX_S = 1.0


def progress_save_due(since_s: float, quiet: bool) -> bool:
    """Whether a tick that only took the ranks' records in saves, ``since_s`` after the last
    save: from :data:`PROGRESS_SAVE_S` on at a ``quiet`` tick (one that read no step record),
    and at :data:`PROGRESS_SAVE_MAX_S` whatever it read.

    Why wait for a quiet tick: a thousand groups' steps arrive together, and a save in the tick
    that reads them (about 35 ms beside about 50 at 1,024 groups) made the longest ticks; the
    ticks between two steps read nothing.

    Args:
        since_s: since the last save.
        quiet: this tick read no step record.
    """
    return since_s >= PROGRESS_SAVE_MAX_S or (quiet and since_s >= PROGRESS_SAVE_S)


def progress_only(actions: Iterable[Any]) -> bool:
    """Whether a tick's actions only relayed the ranks' records (metrics, the ranks' own
    events) and wrote the commit floor: all a new controller redoes by reading the same
    records again from the saved offsets. Anything else (a launch, a failure, the
    controller's own event) is saved at the end of its tick."""
    for a in actions:
        if isinstance(a, Emit):
            if not a.relay:
                return False
        elif not isinstance(a, (WriteMetrics, WriteFloor)):
            return False
    return True


# How much of metrics.jsonl's end relayed_records reads: what a controller killed before its
# save relayed since (PROGRESS_SAVE_MAX_S and a tick: about 3 MB at 1,024 groups), twice over.
METRICS_LOOK_BACK = 8 << 20


# controller.json's own fields, beside the job state's.
_FILE_FIELDS = ("version", "finished", "controller_pid")


# ---------------------------------------------------------------- relayed once
def relayed_records(events: list[dict], metrics_path: str, tail_bytes: int = METRICS_LOOK_BACK) -> set[tuple]:
    """(rank pid, record time) of every rank record already relayed to events.jsonl and
    (the newest ``tail_bytes`` of) metrics.jsonl. A controller killed between relaying a
    tick's records and saving its report offsets leaves them to be read again by the next:
    :class:`ResumedTail` marks them relayed, so each record is relayed once."""
    keys = {(e.get("pid"), e.get("time")) for e in events if "rank" in e and "pid" in e}
    keys.update((rec.get("pid"), rec.get("time")) for rec in tail_records(metrics_path, tail_bytes))
    return keys


class ResumedTail(ReportTail):
    """A report read on from a previous controller's saved offset; the records it had relayed
    after its last save are marked ``relayed`` (its first read covers them all): the tick takes
    them in as any record (the job's step, a rank's readiness) and relays them no second time.

    Taken in, not dropped: the controller saves a tick that only took records in at most every
    :data:`PROGRESS_SAVE_MAX_S`, so what it knew of them since (a rank's ``model_ready``, the
    commits that moved the job's step) lives only in those records.

    Args:
        path: the rank's report file.
        relayed: :func:`relayed_records`.
    """

    def __init__(self, path: str, relayed: set[tuple]) -> None:
        super().__init__(path)
        self._relayed: Optional[set[tuple]] = relayed

    def read_records(self) -> list[ReportRecord]:
        # What the tick observes a rank's report through. When only read was filtered, a
        # takeover relayed those records a second time (a step committed twice in metrics.jsonl,
        # so the drill's steps_never_go_back failed: a two-worker job tier caught it).
        relayed, self._relayed = self._relayed, None
        if not relayed:
            return super().read_records()
        return [parse_record(raw, line, (raw.get("pid"), raw.get("time")) in relayed) for raw, line in self.read_lines()]


def committed_steps(metrics_path: str, spans: list[tuple[float, float]]) -> list[int]:
    """How many distinct steps rank 0 of any group committed within each (from, until) span."""
    found: list[set[int]] = [set() for _ in spans]
    for rec in read_records(metrics_path, having=b'"committed": true'):
        if rec.get("rank") != 0:
            continue
        for i, (start, end) in enumerate(spans):
            if start <= rec.get("time", 0) <= end:
                found[i].add(rec["step"])
    return [len(f) for f in found]
