"""A rank frozen past the heartbeat timeout holds its next quorum request back
(monarch_ft.rank.components.freeze): the decision with a fake clock, then a real process
stopped and continued with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from monarch_ft.rank.components.freeze import Froze, FreezeWatch, is_freeze, settle_left


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 5.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_a_freeze_is_a_long_gap_mostly_off_the_cpu():
    assert is_freeze(10.0, 0.01, 0.2) and is_freeze(0.5, 0.01, 0.2)
    assert not is_freeze(0.15, 0.0, 0.2), "within the heartbeat timeout"
    assert not is_freeze(0.5, 0.45, 0.2), "on the CPU: the GIL held, the process running"
    assert not is_freeze(0.6, 0.15, 0.2), "starved, a third of a core: its heartbeats went on"


def test_settle_left_counts_from_the_wake():
    assert settle_left(10.0, None, 0.4) == 0.0
    assert abs(settle_left(10.1, Froze(10.0, 5.0), 0.4) - 0.3) < 1e-9
    assert settle_left(11.0, Froze(10.0, 5.0), 0.4) == 0.0


def test_only_a_gap_past_the_threshold_holds_the_next_quorum_back_once():
    clock = _Clock()
    watch = FreezeWatch(threshold_s=0.2, settle_s=0.4, tick_s=0.05, clock=clock, cpu=lambda: clock.cpu, sleep=clock.sleep, start=False)
    for _ in range(10):  # ticking on time
        clock.now += 0.05
        watch.tick()
    clock.now += 0.4  # the main thread held the GIL 0.4 s, on the CPU: the heartbeats went on
    clock.cpu += 0.4
    watch.tick()
    assert watch.settle() is None and clock.slept == []
    clock.now += 10.0  # stopped for 10 s
    watch.tick()  # the thread's first tick after the wake
    clock.now += 0.1  # the rank finishes its step
    froze, waited = watch.settle()
    assert abs(froze.frozen_s - 10.0) < 1e-9 and abs(waited - 0.3) < 1e-9 and clock.slept == [waited]
    assert watch.settle() is None, "one wait per freeze"
    clock.now += 5.0  # frozen again, woken right at the request: settle()'s own tick sees it
    froze, waited = watch.settle()
    assert abs(froze.frozen_s - 5.0) < 1e-9 and abs(waited - 0.4) < 1e-9


def test_a_process_stopped_with_sigstop_waits_after_sigcont():
    code = (
        "import sys\n"
        "from monarch_ft.rank.components.freeze import FreezeWatch\n"
        "w = FreezeWatch(threshold_s=0.2, settle_s=0.4, tick_s=0.02)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "s = w.settle()\n"
        "print(s[0].frozen_s, s[1], flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        frozen_s, waited_s = map(float, proc.stdout.readline().split())
    finally:
        proc.kill()
        proc.wait()
    assert frozen_s >= 0.9, frozen_s
    assert 0.0 < waited_s <= 0.4, waited_s
