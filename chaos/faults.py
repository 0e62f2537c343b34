"""The faults themselves: real signals to real processes, real files deleted.

Each ``inject_*`` acts on one replica group of a running :class:`Supervisor` and
returns what it did (for the event log). Detection and recovery are left entirely to
the supervisor and TorchFT: nothing here tells them a fault happened.
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Callable

from monarch_ft.components.fault_agent import request_collective_fault

from chaos.config import FaultConfig


def _signal_rank(sup, group: int, rank: int, sig: int) -> dict:
    rs = sup.groups[group].ranks[rank]
    pid = rs.proc.pid
    rs.proc.send_signal(sig)
    return {"pid": pid, "signal": signal.Signals(sig).name}


def inject_process_kill(sup, group: int, fault: FaultConfig) -> dict:
    return _signal_rank(sup, group, fault.rank, signal.SIGKILL)


def inject_segfault(sup, group: int, fault: FaultConfig) -> dict:
    return _signal_rank(sup, group, fault.rank, signal.SIGSEGV)


def inject_sigterm(sup, group: int, fault: FaultConfig) -> dict:
    return _signal_rank(sup, group, fault.rank, signal.SIGTERM)


def inject_hang(sup, group: int, fault: FaultConfig) -> dict:
    """SIGSTOP: the rank stays alive but makes no progress; only timeouts can tell."""
    return _signal_rank(sup, group, fault.rank, signal.SIGSTOP)


def inject_node(sup, group: int, fault: FaultConfig) -> dict:
    """The whole host goes: every rank of the group at once, and its local files."""
    pids = []
    for rs in sup.groups[group].ranks:
        pids.append(rs.proc.pid)
        rs.proc.send_signal(signal.SIGKILL)
    deleted = []
    for path in (sup.scratch_dir(group), sup.checkpoint_dir(group)):
        if os.path.exists(path):
            count = sum(len(files) for _, _, files in os.walk(path))
            shutil.rmtree(path)
            deleted.append({"path": path, "files": count})
    return {"pids": pids, "signal": "SIGKILL", "deleted": deleted}


def inject_collective(sup, group: int, fault: FaultConfig) -> dict:
    path = request_collective_fault(sup.layout, group, fault.rank, fault.mode, fault.duration_s)
    return {"mode": fault.mode, "request": path, "pid": sup.groups[group].ranks[fault.rank].proc.pid}


def _hosts(sup, kind: str):
    launcher = sup.launcher
    if not getattr(launcher, "simulated_hosts", False):
        raise RuntimeError(f"a {kind} fault needs simulated hosts: use launcher=local_hosts (launcher.options.simulated_hosts=true)")
    return launcher


def _on_restore(sup, group: int, kind: str) -> Callable[[dict], None]:
    """Called (timer thread) when the link is back: the event recovery is measured from."""

    def restored(info: dict) -> None:
        sup.events.emit("link_restored", time=info["restored_at"], group=group, fault_kind=kind, lasted_s=info["lasted_s"])

    return restored


def inject_partition(sup, group: int, fault: FaultConfig) -> dict:
    """The group's host drops off the network (its link down) for duration_s, then comes back."""
    launcher = _hosts(sup, "partition")
    return launcher.partition(group, fault.duration_s, on_restore=_on_restore(sup, group, "partition"))


def inject_slow_link(sup, group: int, fault: FaultConfig) -> dict:
    """The group's host link gets latency and/or a rate limit for duration_s."""
    launcher = _hosts(sup, "slow_link")
    return launcher.slow_link(group, fault.delay_ms, fault.rate, fault.duration_s, on_restore=_on_restore(sup, group, "slow_link"))


INJECTORS: dict[str, Callable[..., dict]] = {
    "process_kill": inject_process_kill,
    "segfault": inject_segfault,
    "sigterm": inject_sigterm,
    "hang": inject_hang,
    "node": inject_node,
    "collective": inject_collective,
    "partition": inject_partition,
    "slow_link": inject_slow_link,
}
