"""Child-process hygiene shared by everything the supervisor starts."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the kernel SIGKILLs the child when the process that started it dies,
    so a SIGKILLed supervisor leaves no rank or Lighthouse behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
