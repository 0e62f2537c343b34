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
"""

from __future__ import annotations

import os
from typing import Optional

_CAP_SYS_NICE = 23


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


def to_background(niceness: int) -> None:
    """This thread (and every thread it starts from now on) at ``niceness`` more, and under
    ``SCHED_IDLE`` where the kernel has it. Safe in a ``preexec_fn``: nothing is raised for
    ``SCHED_IDLE`` refused (the niceness is then what is left)."""
    if niceness:
        os.nice(niceness)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def to_foreground() -> Optional[str]:
    """Every thread of this process back at ``SCHED_OTHER`` and niceness 0. Lowering the
    niceness needs CAP_SYS_NICE: the error is returned (and reported by the caller) rather than
    raised; the process then runs in the background still."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError as e:
        return str(e)
    error = None
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
