"""``segfault``: SIGSEGV to one rank, as a crash in native code ends it."""

from __future__ import annotations

import signal

from chaos.kinds.base import SignalFault


class Segfault(SignalFault):
    name = "segfault"
    signal = signal.SIGSEGV


KIND = Segfault()
