"""The clock a controller reads and sleeps on: the system's by default, a test's fake one in
the fast tests (``monarch_ft.testing.fakes.FakeClock``), which drive the real watch loop through
minutes of a job in milliseconds."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds (``time.time``)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """``time.time`` and ``time.sleep``."""

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
