"""A CPU limit on running processes, for a while: how a fail-slow fault (chaos kind ``slow``)
makes one rank, or a whole group, run at a fraction of a CPU.

Two mechanisms, the first the machine allows:

- ``cgroup``: each process moved into a cgroup of its own with a CPU quota (cgroup v2
  ``cpu.max``, or v1 ``cpu.cfs_quota_us`` under the ``cpu`` controller's mount): at most
  ``fraction`` of one CPU. And a weight of ``fraction`` of a plain process's (v2 ``cpu.weight``,
  v1 ``cpu.shares``): on a machine so loaded that every process already gets less than
  ``fraction`` of a CPU the quota alone would not bind, the weight still makes it that much
  slower than its peers. The kernel's scheduler enforces both; the process never notices but
  runs slower. Undone by moving the
  process back into the cgroup it came from and removing the new one: no cgroup is left behind.
- ``sigstop``: a thread of the caller stops and continues the processes in a duty cycle
  (SIGCONT for ``fraction`` of every 100 ms, SIGSTOP for the rest). Coarser (the process is
  visibly stopped for tens of milliseconds at a time) but needs no cgroup. Undone by a last SIGCONT.

Which one ran is recorded (:attr:`CpuThrottle.mechanism`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional, Sequence

from monarch_ft.records.events import StrEnum

CGROUP_ROOT = "/sys/fs/cgroup"
# The duty cycle's period: short enough that no stop lasts long (the hang model's os_stall_s
# is 0.5 s), long enough that the signals cost little.
DUTY_PERIOD_S = 0.1
# The cgroups this module makes are named so (one per throttled process): a leftover is ours.
CGROUP_PREFIX = "monarch_ft_slow_"


class ThrottleMechanism(StrEnum):
    AUTO = "auto"
    CGROUP = "cgroup"
    SIGSTOP = "sigstop"


def _cgroup_v2_cpu() -> Optional[str]:
    """The cgroup v2 root where the ``cpu`` controller can be given to a child, or None."""
    controllers = os.path.join(CGROUP_ROOT, "cgroup.controllers")
    try:
        with open(controllers) as f:
            return CGROUP_ROOT if "cpu" in f.read().split() else None
    except OSError:
        return None


def _cgroup_v1_cpu() -> Optional[str]:
    """The cgroup v1 ``cpu`` controller's mount, when it is writable, or None."""
    for path in (os.path.join(CGROUP_ROOT, "cpu"), os.path.join(CGROUP_ROOT, "cpu,cpuacct")):
        if os.path.exists(os.path.join(path, "cpu.cfs_quota_us")) and os.access(path, os.W_OK):
            return path
    return None


def cgroup_problem() -> Optional[str]:
    """Why a cgroup CPU quota cannot be set here (None: it can)."""
    if _cgroup_v2_cpu() or _cgroup_v1_cpu():
        return None
    return f"no writable cgroup cpu controller under {CGROUP_ROOT} (v2 cpu.max or v1 cpu/cpu.cfs_quota_us)"


def _v1_cgroup_of(pid: int) -> Optional[str]:
    """The v1 ``cpu`` cgroup path ``pid`` is in (``/`` for the root), from /proc/<pid>/cgroup."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    return None


def _v2_cgroup_of(pid: int) -> Optional[str]:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line.rstrip("\n")[3:]
    return None


def cpu_seconds(pid: int) -> Optional[float]:
    """A process's CPU seconds so far (every thread's user + system time); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rates(pids: Sequence[int], seconds: float) -> dict[int, float]:
    """Each process's CPUs in use over the next ``seconds`` (at least 0.02: a process found
    idle gets a quota it can notice; at most the machine's CPUs)."""
    before, t0 = {p: cpu_seconds(p) for p in pids}, time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    out = {}
    for p in pids:
        after = cpu_seconds(p)
        used = (after - before[p]) / elapsed if after is not None and before[p] is not None else 1.0
        out[p] = min(max(used, 0.02), float(os.cpu_count() or 1))
    return out


def _write(cgroup: str, name: str, value: str) -> None:
    with open(os.path.join(cgroup, name), "w") as f:
        f.write(value)


class CpuThrottle:
    """Limits ``pids`` to ``fraction`` of one CPU each until :meth:`stop`.

    Args:
        pids: the processes (a rank, or every rank of a group).
        fraction: of one CPU, in (0, 1).
        mechanism: ``auto`` (a cgroup where the machine allows it, else the duty cycle),
            ``cgroup`` or ``sigstop``.

    Raises:
        RuntimeError: ``cgroup`` asked for where it cannot run (one line saying why).
    """

    def __init__(self, pids: Sequence[int], fraction: float, mechanism: str = ThrottleMechanism.AUTO, measure_s: float = 0.0) -> None:
        if not 0 < fraction < 1:
            raise ValueError(f"fraction={fraction}: must be in (0, 1)")
        self.pids = list(pids)
        self.fraction = fraction
        # Each process's CPUs in use now (measured over measure_s; 1.0 when not measured): the
        # quota is fraction x that, so that a process on a loaded machine, which already gets
        # less than fraction of a CPU, is still slowed to fraction of what it had.
        self.using = cpu_rates(self.pids, measure_s) if measure_s > 0 else {pid: 1.0 for pid in self.pids}
        self.started = time.time()
        self._lock = threading.Lock()
        self._stopped = False
        # pid -> (the cgroup made for it, the cgroup's procs file it came from)
        self._moved: dict[int, tuple[str, str]] = {}
        self._duty: Optional[threading.Thread] = None
        self._halt = threading.Event()
        problem = cgroup_problem()
        if mechanism == ThrottleMechanism.CGROUP and problem:
            raise RuntimeError(f"a cgroup CPU quota cannot be set: {problem}")
        self.mechanism = ThrottleMechanism.CGROUP if mechanism != ThrottleMechanism.SIGSTOP and not problem else ThrottleMechanism.SIGSTOP
        if self.mechanism is ThrottleMechanism.CGROUP:
            try:
                self._start_cgroups()
            except OSError:
                self._undo_cgroups()
                if mechanism == ThrottleMechanism.CGROUP:
                    raise
                self.mechanism = ThrottleMechanism.SIGSTOP
        if self.mechanism is ThrottleMechanism.SIGSTOP:
            self._duty = threading.Thread(target=self._duty_cycle, name="mft-cpu-throttle", daemon=True)
            self._duty.start()

    # ------------------------------------------------------------ cgroups
    def _start_cgroups(self) -> None:
        v2 = _cgroup_v2_cpu()
        root = v2 or _cgroup_v1_cpu()
        period_us = 100_000
        for pid in self.pids:
            quota_us = max(1000, int(self.fraction * self.using.get(pid, 1.0) * period_us))
            origin = _v2_cgroup_of(pid) if v2 else _v1_cgroup_of(pid)
            if origin is None:
                raise OSError(f"pid {pid} is in no cpu cgroup")
            parent = os.path.join(root, origin.lstrip("/"))
            path = os.path.join(parent if v2 else root, f"{CGROUP_PREFIX}{pid}")
            os.makedirs(path, exist_ok=True)
            self._moved[pid] = (path, os.path.join(parent, "cgroup.procs"))
            if v2:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpu")
                _write(path, "cpu.max", f"{quota_us} {period_us}")
                _write(path, "cpu.weight", str(max(1, int(100 * self.fraction))))
            else:
                _write(path, "cpu.cfs_period_us", str(period_us))
                _write(path, "cpu.cfs_quota_us", str(quota_us))
                _write(path, "cpu.shares", str(max(2, int(1024 * self.fraction))))
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def _undo_cgroups(self) -> list[str]:
        """Every moved process back where it came from, every cgroup made removed; returns the
        cgroups that could not be removed (none, unless a process of ours forked into one and
        cannot be moved)."""
        left = []
        for pid, (path, origin_procs) in list(self._moved.items()):
            # The quota lifted first: a process moved out of a cgroup while it is throttled (its
            # share of the period spent) can sit unscheduled after the move, its old runqueue's
            # unthrottle timer gone with the removed cgroup (seen here: no CPU for 0.4 s after
            # a release, one time in four).
            for name, unlimited in (("cpu.max", "max"), ("cpu.cfs_quota_us", "-1")):
                if os.path.exists(os.path.join(path, name)):
                    try:
                        _write(path, name, unlimited)
                    except OSError:
                        pass
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    inside = [int(p) for p in f.read().split()]
            except OSError:
                inside = []
            for p in inside:
                try:
                    with open(origin_procs, "w") as f:
                        f.write(str(p))
                except OSError:
                    pass  # exited meanwhile
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(path)
            self._moved.pop(pid, None)
        return left

    # ------------------------------------------------------------ the duty cycle
    def _signal_all(self, sig: int) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _duty_cycle(self) -> None:
        run_s, stop_s = self.fraction * DUTY_PERIOD_S, (1 - self.fraction) * DUTY_PERIOD_S
        try:
            while not self._halt.is_set():
                self._signal_all(signal.SIGCONT)
                if self._halt.wait(run_s):
                    break
                self._signal_all(signal.SIGSTOP)
                self._halt.wait(stop_s)
        finally:
            self._signal_all(signal.SIGCONT)

    # ------------------------------------------------------------ the end
    def stop(self) -> dict:
        """Lift the limit now (idempotent); what was done, for the event log."""
        with self._lock:
            if self._stopped:
                return {}
            self._stopped = True
        left: list[str] = []
        if self.mechanism is ThrottleMechanism.CGROUP:
            left = self._undo_cgroups()
        else:
            self._halt.set()
            if self._duty is not None and self._duty is not threading.current_thread():
                self._duty.join(timeout=2.0)
            self._signal_all(signal.SIGCONT)
        out = {"mechanism": self.mechanism.value, "lasted_s": round(time.time() - self.started, 3)}
        if left:
            out["cgroups_left"] = left
        return out

    def describe(self) -> dict:
        """What was done, for ``fault_injected``."""
        out = {
            "mechanism": self.mechanism.value,
            "pids": self.pids,
            "cpu_fraction": self.fraction,
            "cpus_in_use": {str(p): round(u, 3) for p, u in self.using.items()},
        }
        if self.mechanism is ThrottleMechanism.CGROUP:
            out["cgroups"] = [path for path, _ in self._moved.values()]
        return out


def leftover_cgroups() -> list[str]:
    """Cgroups this module made that still exist (a test's check that none is left behind)."""
    found = []
    for root in filter(None, (_cgroup_v1_cpu(), _cgroup_v2_cpu())):
        for dirpath, dirnames, _ in os.walk(root):
            found += [os.path.join(dirpath, d) for d in dirnames if d.startswith(CGROUP_PREFIX)]
            dirnames[:] = [d for d in dirnames if not d.startswith(CGROUP_PREFIX)]
    return found
