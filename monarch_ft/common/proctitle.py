"""What ``ps``, ``top`` and ``py-spy`` show for each process of a job.

Each process of a job names its run and what it is, in one short title that grep can find:

    monarch_ft[/abs/run/dir] controller
    monarch_ft[/abs/run/dir] lighthouse_guard
    monarch_ft[/abs/run/dir] forkserver
    monarch_ft[/abs/run/dir] g1r0 a2           a rank: group 1, rank 0, attempt 2
    monarch_ft[/abs/run/dir] standby 1 r0      rank 0 of warm standby 1, until its promotion
    monarch_ft[/abs/run/dir] drill_watchdog    a drill's watchdog (controller faults)

``ps ax | grep 'monarch_ft\\[.*drill2\\]'`` lists one run's processes, and adding `` g1`` narrows
it to one group. The run is named by its directory, as the CLI names it
(``monarch_ft status RUN_DIR``). That keeps working any tool that finds a run's processes
by a command line mentioning the run directory (the tests' leak checks, for one).

How: setproctitle rewrites the process's argv memory, so /proc/PID/cmdline reads the title,
and sets the kernel's 15-byte name (``top``'s default column) to ``mft:<what>``, e.g.
``mft:g1r0.a2``. /proc/PID/environ is kept intact (``SPT_NOENV``): an operator reads a rank's
environment there, and the local Slurm cluster finds its job processes by theirs. The price
is that a title can be no longer than the original command line. A title that does not fit
keeps what the process is and the end of the run directory
(``monarch_ft[...outputs/drill2] controller``).

Processes whose command line belongs to something else keep it: a Monarch proc (Monarch and
its tools find procs as ``bootstrap_main``) and the Lighthouse server itself. A process that
was never titled (a Monarch proc running a rank) is not retitled on promotion either.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

PREFIX = "monarch_ft"
# The kernel keeps 15 bytes of a process's name (TASK_COMM_LEN - 1).
COMM_LEN = 15


@dataclass(frozen=True)
class Role:
    """What a process is.

    Args:
        text: in the title, after the run: ``g1r0 a2``.
        short: in the kernel's 15-byte name, after ``mft:``: ``g1r0.a2``.
    """

    text: str
    short: str


CONTROLLER = Role("controller", "controller")
FORK_SERVER = Role("forkserver", "forkserver")
LIGHTHOUSE_GUARD = Role("lighthouse_guard", "lh_guard")
DRILL_WATCHDOG = Role("drill_watchdog", "watchdog")


def rank_role(group: int, rank: int, attempt: int) -> Role:
    """Rank ``rank`` of replica group ``group``, launch attempt ``attempt`` (its report files' ``g1r0.a2``)."""
    return Role(f"g{group}r{rank} a{attempt}", f"g{group}r{rank}.a{attempt}")


def standby_role(standby: int, rank: int) -> Role:
    """Rank ``rank`` of warm standby ``standby``, waiting (its spec file's ``sb1r0``)."""
    return Role(f"standby {standby} r{rank}", f"sb{standby}r{rank}")


def rank_or_standby(group: int, rank: int, attempt: int, standby: int) -> Role:
    """What a rank's spec launches: a waiting standby (``standby`` >= 0) or a rank of a group."""
    return standby_role(standby, rank) if standby >= 0 else rank_role(group, rank, attempt)


def title(run_dir: str, role: Role, room: Optional[int] = None) -> str:
    """``monarch_ft[<run_dir>] <role>``, within ``room`` characters when given. A title too
    long keeps the role and as much of the run directory's end as fits."""
    full = f"{PREFIX}[{run_dir}] {role.text}"
    if room is None or len(full) <= room:
        return full
    fixed = len(PREFIX) + len("[...] ") + len(role.text)
    if room <= fixed:
        return full[:room]
    return f"{PREFIX}[...{run_dir[len(run_dir) - (room - fixed) :]}] {role.text}"


def short_name(role: Role) -> str:
    """The kernel's name for the process (``top``, ``ps -o comm``): ``mft:<role.short>``."""
    return f"mft:{role.short}"[:COMM_LEN]


# The run this process was titled for (set_title); None: never titled.
_run_dir: Optional[str] = None


def _setproctitle():
    """The setproctitle module, ready to keep /proc/PID/environ intact; None where it is not
    installed (a title is for people: the process runs on without one)."""
    try:
        import setproctitle
    except ImportError:
        return None
    # Read once, at setproctitle's first call (any call); children need not inherit it.
    if "SPT_NOENV" not in os.environ:
        os.environ["SPT_NOENV"] = "1"
        setproctitle.getproctitle()
        del os.environ["SPT_NOENV"]
    return setproctitle


def set_title(run_dir: str, role: Role) -> str:
    """Title this process (see the module docstring); returns the title ``ps`` shows ("" without setproctitle)."""
    global _run_dir
    spt = _setproctitle()
    if spt is None:
        return ""
    want = title(run_dir, role)
    spt.setproctitle(want)
    shown = spt.getproctitle()
    if shown != want:  # cut to the original command line's length
        spt.setproctitle(title(run_dir, role, room=len(shown)))
        shown = spt.getproctitle()
    if threading.current_thread() is threading.main_thread():  # the process's name is its main thread's
        spt.setthreadtitle(short_name(role))
    _run_dir = run_dir
    return shown


def retitle(role: Role) -> str:
    """A titled process becoming something else (a standby promoted into a group); a process
    never titled (a Monarch proc) keeps its command line. Returns the title shown, or ""."""
    return set_title(_run_dir, role) if _run_dir is not None else ""


@contextmanager
def titled(run_dir: str, role: Role) -> Iterator[str]:
    """``set_title`` for a while: a process that runs several jobs in turn (the MTTR bench's
    drills) shows the one it runs, and its own command line again after each."""
    global _run_dir
    spt = _setproctitle()
    if spt is None:
        yield ""
        return
    before, before_name, before_run = spt.getproctitle(), spt.getthreadtitle(), _run_dir
    try:
        yield set_title(run_dir, role)
    finally:
        spt.setproctitle(before)
        if threading.current_thread() is threading.main_thread():
            spt.setthreadtitle(before_name)
        _run_dir = before_run
