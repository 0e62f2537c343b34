"""``process_kill``: SIGKILL one rank; its group fails and is relaunched (or replaced by a standby)."""

from __future__ import annotations

import signal

from chaos.kinds.base import SignalFault


class ProcessKill(SignalFault):
    name = "process_kill"
    signal = signal.SIGKILL


KIND = ProcessKill()
