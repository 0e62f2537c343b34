"""A CPU limit on real processes (monarch_ft.common.throttle): a busy child limited to a fraction
of a CPU uses about that much, by cgroup quota where the machine allows it and by the SIGSTOP
duty cycle otherwise; lifting it leaves no cgroup behind and the child running."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from monarch_ft.common.throttle import CpuThrottle, ThrottleMechanism, cgroup_problem, leftover_cgroups

# Real cgroups and busy processes measured over seconds: the integration tier, not the fast one.
pytestmark = pytest.mark.slow


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ours(before: list[str]) -> list[str]:
    """Cgroups made since ``before`` (a drill running beside the test may have its own)."""
    return sorted(set(leftover_cgroups()) - set(before))


@pytest.fixture
def busy():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def used_over(pid: int, seconds: float) -> float:
    before, t0 = cpu_seconds(pid), time.time()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.time() - t0)


@pytest.mark.parametrize("mechanism", [ThrottleMechanism.CGROUP, ThrottleMechanism.SIGSTOP])
def test_a_busy_process_limited_to_a_fifth_of_a_cpu_uses_about_that_and_is_released(busy, mechanism):
    if mechanism is ThrottleMechanism.CGROUP and cgroup_problem():
        pytest.skip(cgroup_problem())
    time.sleep(0.2)
    before = leftover_cgroups()
    throttle = CpuThrottle([busy.pid], 0.2, mechanism)
    try:
        assert throttle.mechanism is mechanism
        described = throttle.describe()
        assert described["mechanism"] == mechanism.value and described["pids"] == [busy.pid]
        if mechanism is ThrottleMechanism.CGROUP:
            assert ours(before) == described["cgroups"]
            (cgroup,) = described["cgroups"]
            if os.path.exists(os.path.join(cgroup, "cpu.shares")):  # v1: a quota of 20 ms per 100 ms, a fifth of the weight
                assert [open(os.path.join(cgroup, f)).read().strip() for f in ("cpu.cfs_quota_us", "cpu.shares")] == ["20000", "204"]
        limited = used_over(busy.pid, 0.8)
        # At most its share (a little slack for the duty cycle's timing); a loaded 2-core machine
        # may give it less, never more.
        assert limited < 0.3, limited
    finally:
        info = throttle.stop()
    assert info["mechanism"] == mechanism.value and info["lasted_s"] > 0.7 and "cgroups_left" not in info
    assert throttle.stop() == {}  # idempotent
    assert ours(before) == []
    assert busy.poll() is None
    with open(f"/proc/{busy.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] in ("R", "S")  # running, not left stopped
    assert used_over(busy.pid, 0.4) > limited


def test_auto_takes_the_cgroup_where_the_machine_allows_it(busy):
    before = leftover_cgroups()
    throttle = CpuThrottle([busy.pid], 0.5)
    try:
        assert throttle.mechanism is (ThrottleMechanism.SIGSTOP if cgroup_problem() else ThrottleMechanism.CGROUP)
    finally:
        throttle.stop()
    assert ours(before) == []


def test_a_process_that_exits_while_limited_leaves_no_cgroup():
    before = leftover_cgroups()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    throttle = CpuThrottle([proc.pid], 0.5)
    proc.wait()
    throttle.stop()
    assert ours(before) == []


def test_a_fraction_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        CpuThrottle([os.getpid()], 1.0)


def test_the_quota_is_a_fraction_of_what_the_process_used(busy):
    # Measured first: the quota is a fraction of the CPUs in use then, not of a whole CPU.
    before = leftover_cgroups()
    throttle = CpuThrottle([busy.pid], 0.5, ThrottleMechanism.CGROUP if not cgroup_problem() else ThrottleMechanism.SIGSTOP, measure_s=0.3)
    try:
        using = throttle.describe()["cpus_in_use"][str(busy.pid)]
        assert 0.02 <= using <= os.cpu_count()
        if throttle.mechanism is ThrottleMechanism.CGROUP and os.path.exists(os.path.join(throttle.describe()["cgroups"][0], "cpu.cfs_quota_us")):
            quota = int(open(os.path.join(throttle.describe()["cgroups"][0], "cpu.cfs_quota_us")).read())
            assert abs(quota - max(1000, int(0.5 * using * 100_000))) <= 100  # using is rounded to 3 digits
    finally:
        throttle.stop()
    assert ours(before) == []
