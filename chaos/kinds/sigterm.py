"""``sigterm``: SIGTERM to one rank, as a scheduler's preemption or an operator's kill does."""

from __future__ import annotations

import signal

from chaos.kinds.base import SignalFault


class Sigterm(SignalFault):
    name = "sigterm"
    signal = signal.SIGTERM


KIND = Sigterm()
