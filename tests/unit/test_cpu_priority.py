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


def test_a_session_leader_takes_its_autogroup_to_the_background_and_back():
    """Autogroups share the CPU among sessions before niceness counts (module docstring): a
    process that leads its session sets its autogroup's niceness with its own, and back to 0;
    one in another's session leaves that session's autogroup alone."""
    from monarch_ft.common.cpu_priority import autogroup_nice

    parent = autogroup_nice()

    def leader() -> int:
        os.setsid()
        if autogroup_nice() is None:
            return 0 if parent is None else 5  # no autogroups here: nothing to set
        to_background(7)
        if autogroup_nice() != 7:
            return 2
        if to_foreground() is not None:
            return 3
        return 0 if autogroup_nice() == 0 else 4

    def member() -> int:
        to_background(7)  # not a session leader: the test's own session is not niced
        return 0 if autogroup_nice() == parent else 6

    assert _in_child(leader) == 0
    assert _in_child(member) == 0
    assert autogroup_nice() == parent
