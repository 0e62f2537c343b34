"""The launcher interface: how the supervisor turns rank specs into running ranks.

The supervisor only ever sees :class:`RankProcess` handles (poll, signal, pid), so a
Slurm launcher (a job of M tasks per group) or a Monarch launcher (a proc mesh per
group) plugs in by implementing :class:`Launcher` without touching the supervisor.
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Optional


@dataclass
class RankLaunch:
    group: int
    rank: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    log_path: str
    cwd: str
    # Logical host the rank is placed on (a simulated host on one machine).
    host: str = "localhost"
    extra: dict = field(default_factory=dict)


class RankProcess(ABC):
    """One running rank, wherever it runs."""

    launch: RankLaunch

    @property
    @abstractmethod
    def pid(self) -> Optional[int]:
        """OS pid when the rank runs on this machine (for psutil), else None."""

    @abstractmethod
    def poll(self) -> Optional[int]:
        """None while running; else the exit code, negative for a signal (as subprocess)."""

    @abstractmethod
    def send_signal(self, sig: int) -> None:
        ...

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> Optional[int]:
        """Wait up to ``timeout`` seconds for the exit code (polls; launchers may do better)."""
        deadline = time.time() + timeout
        while True:
            code = self.poll()
            if code is not None or time.time() >= deadline:
                return code
            time.sleep(0.05)


class Launcher(ABC):
    name: str = "base"

    def group_host(self, group: int) -> str:
        """Address the ranks of ``group`` bind and advertise (their TCPStore, Manager, transport)."""
        return "127.0.0.1"

    def control_host(self) -> str:
        """Address on which supervisor-side services (the Lighthouse) must listen to be reachable."""
        return "127.0.0.1"

    def describe(self) -> dict:
        """Launcher and host layout, for the event log and reports."""
        return {"launcher": self.name, "hosts": "localhost"}

    @abstractmethod
    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        """Start every rank of one replica group (all or none)."""

    def close(self) -> None:
        """Release whatever the launcher holds (allocations, connections)."""


class RankExit(IntEnum):
    """Exit codes a rank ends with on purpose (anything else non-zero is a crash)."""

    OK = 0
    # It was about to commit a step below the job's committed step (trainer.CommitFloor).
    COMMIT_BELOW_FLOOR = 75
    # A checkpoint save outlived checkpoint.save_timeout_s (trainer.SaveWatchdog).
    SAVE_TIMEOUT = 76


def describe_exit(code: Optional[int]) -> dict:
    """Exit code -> {"exit_code": n} or {"signal": "SIGKILL"} for the event log, with the
    :class:`RankExit` name for a deliberate exit."""
    if code is None:
        return {}
    if code < 0:
        try:
            return {"signal": signal.Signals(-code).name, "exit_code": code}
        except ValueError:
            return {"signal": f"SIG{-code}", "exit_code": code}
    if code in RankExit._value2member_map_ and code != 0:
        return {"exit_code": code, "exit_reason": RankExit(code).name.lower()}
    return {"exit_code": code}
