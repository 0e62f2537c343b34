"""The faults themselves: real signals to real processes, real files deleted.

Each ``inject_*`` acts on one replica group of a running :class:`Supervisor` and
returns what it did (for the event log). Detection and recovery are left entirely to
the supervisor and TorchFT: nothing here tells them a fault happened.
"""

from __future__ import annotations

import signal
from typing import Callable

from chaos.config import FaultConfig, fault_mode
from monarch_ft.components.fault_agent import GIL_HANG_SIGNAL
from monarch_ft.control import JobControl


def inject_process_kill(job: JobControl, group: int, fault: FaultConfig) -> dict:
    return job.signal_rank(group, fault.rank, signal.SIGKILL)


def inject_segfault(job: JobControl, group: int, fault: FaultConfig) -> dict:
    return job.signal_rank(group, fault.rank, signal.SIGSEGV)


def inject_sigterm(job: JobControl, group: int, fault: FaultConfig) -> dict:
    return job.signal_rank(group, fault.rank, signal.SIGTERM)


def inject_hang(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """The rank stays alive but makes no progress.

    ``sigstop``: SIGSTOP; its OS state says "stopped". ``gil``: the rank's own fault agent
    answers GIL_HANG_SIGNAL by sleeping in a C call that keeps the GIL (the Monarch example's
    DEADLOCK fault): no thread of it runs Python any more, its liveness thread goes silent,
    and its OS state ("sleeping") looks like its peers' waiting in a collective for it.
    """
    if fault_mode(fault) == "gil":
        return {**job.signal_rank(group, fault.rank, GIL_HANG_SIGNAL), "mode": "gil"}
    return {**job.signal_rank(group, fault.rank, signal.SIGSTOP), "mode": "sigstop"}


def inject_node(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """The whole host goes: every rank of the group at once, and its local files."""
    return job.kill_host(group)


def inject_collective(job: JobControl, group: int, fault: FaultConfig) -> dict:
    return job.collective_fault(group, fault.rank, fault_mode(fault), fault.duration_s)


def inject_partition(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """The group's host drops off the network (its link down) for duration_s, then comes back."""
    return job.partition(group, fault.duration_s)


def inject_slow_link(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """The group's host link gets latency and/or a rate limit for duration_s."""
    return job.slow_link(group, fault.delay_ms, fault.rate, fault.duration_s)


def inject_controller(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """SIGKILL the supervisor itself. The injector runs inside it, so the drill's watchdog
    (chaos/watchdog.py, a separate process) does the kill on request, and after
    ``delay_s`` attaches a new controller (controller.attach=true)."""
    from chaos.watchdog import request_controller_kill

    rank = (group, fault.rank) if fault.kill_rank_unsupervised else None
    return request_controller_kill(job.run_layout, fault.delay_s, rank)


def inject_lighthouse(job: JobControl, group: int, fault: FaultConfig) -> dict:
    """SIGKILL the Lighthouse server; the supervisor restarts it on the same address."""
    return job.kill_lighthouse()


INJECTORS: dict[str, Callable[..., dict]] = {
    "process_kill": inject_process_kill,
    "segfault": inject_segfault,
    "sigterm": inject_sigterm,
    "hang": inject_hang,
    "node": inject_node,
    "collective": inject_collective,
    "partition": inject_partition,
    "slow_link": inject_slow_link,
    "controller": inject_controller,
    "lighthouse": inject_lighthouse,
}
