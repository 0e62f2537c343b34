"""Child-process hygiene shared by everything the controller starts, and process identities
(a pid with its start time) that outlive the controller that recorded them."""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from typing import Optional

from monarch_ft.paths import REPO_ROOT

_PR_SET_PDEATHSIG = 1


def on_python_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on PYTHONPATH: a process started as ``python -m
    monarch_ft....`` imports this code, whatever its working directory."""
    env = dict(env)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def die_with_parent() -> None:
    """``preexec_fn``: the kernel SIGKILLs the child when the process that started it dies.
    For helpers' own children (the Lighthouse guard's server, a Slurm task's rank); the
    ranks and the Lighthouse outlive the controller (monarch_ft.controller.takeover)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def outlive_parent() -> None:
    """Undo :func:`die_with_parent` from inside the process (a warm standby, promoted into a
    training group, must outlive its controller as every training rank does)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, 0)
    except OSError:
        pass


def _stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat's fields after the command name (the state is [0], the start time
    [19]), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> Optional[str]:
    """When ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or None
    if it is gone: with the pid it names one process, never a later one reusing the pid."""
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def is_zombie(pid: int) -> bool:
    """Exited but not reaped yet (an orphan waits for whatever init the machine has)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in ("Z", "X")


def is_running(pid: Optional[int], start: Optional[str]) -> bool:
    """The process ``pid`` that started at ``start`` is still running (not a later one, not a
    zombie): one read of its stat file (a forked rank's poll asks every tick)."""
    fields = _stat_fields(pid) if pid and start is not None else None
    return bool(fields) and len(fields) > 19 and fields[19] == start and fields[0] not in ("Z", "X")


@dataclass(frozen=True)
class ProcessIdentity:
    """One process: its pid and its start time (clock ticks since boot). The pair never
    names a later process that reuses the pid."""

    pid: int
    start: Optional[str]

    @classmethod
    def of(cls, pid: Optional[int]) -> Optional["ProcessIdentity"]:
        if not pid:
            return None
        return cls(pid, start_ticks(pid))

    def alive(self) -> bool:
        """Still running: the same process, and not a zombie (a rank orphaned by a killed
        controller is reaped by whatever init the machine has, maybe late)."""
        return is_same_process(self.start, start_ticks(self.pid)) and not is_zombie(self.pid)


def is_same_process(recorded_start: Optional[str], current_start: Optional[str]) -> bool:
    """The recorded process still runs: its pid exists and started when it did then."""
    return recorded_start is not None and current_start == recorded_start


def process_sample(pid: Optional[int]) -> tuple[Optional[str], Optional[float]]:
    """A process's psutil state and its CPU seconds (every thread's user + system), read at once;
    (None, None) without a pid (a rank the launcher does not run here), ("gone", None) once gone."""
    # Imported here: the Slurm task wrapper (monarch_ft.launcher._slurm_task) imports this module
    # in an interpreter without site-packages (-S), where psutil is not importable.
    import psutil

    if pid is None:
        return None, None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            times = p.cpu_times()
            return p.status(), times.user + times.system
    except psutil.Error:
        return "gone", None


def process_status(pid: Optional[int]) -> Optional[str]:
    """psutil's view of a process: 'running', 'sleeping', 'stopped' (SIGSTOP), 'zombie', ..."""
    return process_sample(pid)[0]


def pid_space() -> Optional[str]:
    """Which pids this process can see: the kernel's boot id and this pid namespace's inode.

    Two processes with the same pid space see each other's pids (and start times), whatever
    their hostnames: a Slurm task on a simulated node (its own network namespace and host
    name, this kernel) is watched by pid like a local one, where a task on another machine,
    or in a container with its own pid namespace, is not. None where /proc does not say.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def allow_open_files() -> int:
    """Raise this process's limit of open files to its hard limit (capped at 2^20); the limit now.

    The controller keeps each rank's report file open (a read a tick, not an open a tick): at a
    thousand groups with their standbys that passes the usual soft limit of 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = (1 << 20) if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft
