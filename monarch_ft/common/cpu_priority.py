"""Background CPU priority: what a warm standby's build and a fork server's imports run at while
the job trains on the same cores, and how a process takes the foreground back.

Niceness alone does not keep them out of training's way. A niced process gets a core whenever a
rank waits in its allreduce, and the rank, woken by its peers, may then wait out the niced one's
slice before it runs again: on a 2-core host a standby building at niceness 10 next to three ranks
took a third off the job's rate (docs/results/drill-stragglers, "Evict again"). ``SCHED_IDLE``
runs a thread only when no normal thread wants the core, and a waking normal thread preempts it at
once. Both are applied: the niceness still orders background work among itself, and is what is
left where ``SCHED_IDLE`` is refused.

Linux keeps both per thread, and a new thread inherits its creator's: applied before the imports
start threads, they cover every thread; taken back, every thread of the process is walked.

Neither reaches past the process's session where the kernel groups tasks by session
(``CONFIG_SCHED_AUTOGROUP``, on by default in most distributions' kernels, and here): CPU time is
shared among sessions first, each at its autogroup's weight, and a thread's niceness and policy
count only against threads of its own session. Every rank and every background process runs in a
session of its own (``start_new_session``, the fork server's ``setsid``), so a standby importing
at niceness 10 under ``SCHED_IDLE`` took as much of a shared core as a training rank: a rank
needing 15 ms of CPU took 31 ms beside one, and 15 ms once the background session's autogroup was
niced too (a measure on this machine, 2026-12-05). A straggler drill beside two CPU hogs named a
healthy group 2.5x slower than its peers while the next standby built (and under
``ft.straggler=evict`` with another standby ready would have evicted it). So a process that leads
its own session also sets its autogroup's niceness (``/proc/self/autogroup``) to the niceness it
asked for, and back to 0 with the rest; elsewhere (a process in another's session) there is no
autogroup of its own to set.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Optional

_CAP_SYS_NICE = 23
AUTOGROUP = "/proc/self/autogroup"
# Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms machine-wide (EAGAIN).
_AUTOGROUP_TRIES = 20


def may_raise_priority(status_path: str = "/proc/self/status") -> bool:
    """Whether this process may take the foreground back after :func:`to_background` (lowering
    a niceness needs CAP_SYS_NICE in the effective set): what decides if a fork server may import
    in the background (monarch_ft.rank.zygote)."""
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def autogroup_nice(path: str = AUTOGROUP) -> Optional[int]:
    """This session's autogroup niceness (None: no autogroups in this kernel)."""
    try:
        with open(path) as f:
            return int(f.read().split("nice")[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, path: str = AUTOGROUP) -> Optional[str]:
    """Set this session's autogroup niceness, if this process leads its session (else the
    autogroup is another process's: left alone). Returns why it failed (None: set, or nothing to
    set). Safe in a ``preexec_fn`` after ``setsid``.

    Args:
        nice: the niceness, -20..19 (below 0 needs CAP_SYS_NICE, as for a thread).
        path: the autogroup file (tests give another).
    """
    if os.getsid(0) != os.getpid():
        return None
    current = autogroup_nice(path)
    if current is None or current == nice:
        return None
    for _ in range(_AUTOGROUP_TRIES):
        try:
            with open(path, "w") as f:
                f.write(str(nice))
            return None
        except OSError as e:
            if e.errno != errno.EAGAIN:
                return f"{type(e).__name__}: {e}"
            time.sleep(0.1)
    return f"{path}: the kernel refused the change {_AUTOGROUP_TRIES} times (EAGAIN)"


def to_background(niceness: int) -> None:
    """This thread (and every thread it starts from now on) at ``niceness`` more, and under
    ``SCHED_IDLE`` where the kernel has it; its session's autogroup at that niceness too when it
    leads its session (see the module's docstring). Safe in a ``preexec_fn``: nothing is raised
    for ``SCHED_IDLE`` or the autogroup refused (the niceness is then what is left)."""
    if niceness:
        os.nice(niceness)
        set_autogroup_nice(min(19, os.getpriority(os.PRIO_PROCESS, 0)))
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def to_foreground() -> Optional[str]:
    """Every thread of this process back at ``SCHED_OTHER`` and niceness 0, and its session's
    autogroup at 0 when it leads its session. Lowering the niceness needs CAP_SYS_NICE: the error
    is returned (and reported by the caller) rather than raised; the process then runs in the
    background still."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError as e:
        return str(e)
    error = set_autogroup_nice(0)
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
    return error
