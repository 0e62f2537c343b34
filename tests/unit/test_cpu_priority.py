"""Background CPU priority (monarch_ft.common.cpu_priority), on real threads of a real child."""

import os
import threading

import pytest

from monarch_ft.common.cpu_priority import may_raise_priority, to_background, to_foreground


def _in_child(body) -> int:
    """Run ``body`` in a forked child (priorities are per process tree); its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = body()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _policies() -> set[tuple[int, int]]:
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    return {(os.sched_getscheduler(t), os.getpriority(os.PRIO_PROCESS, t)) for t in tids}


def test_background_covers_later_threads_and_foreground_takes_every_thread_back():
    if not may_raise_priority():
        pytest.fail("the test runs as root (CAP_SYS_NICE), as the project's CI does")

    def body() -> int:
        to_background(7)
        done = threading.Event()
        worker = threading.Thread(target=done.wait)  # started in the background: inherits it
        worker.start()
        try:
            if _policies() != {(os.SCHED_IDLE, 7)}:
                return 2
            if to_foreground() is not None:
                return 3
            return 0 if _policies() == {(os.SCHED_OTHER, 0)} else 4
        finally:
            done.set()
            worker.join()

    assert _in_child(body) == 0
