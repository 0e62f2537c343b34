"""``hang``: the rank stays alive but makes no progress; the supervisor's hang verdict fails its group.

Modes: ``sigstop`` (the default) SIGSTOPs it, and its OS state says "stopped". ``gil``: the
rank's own fault agent answers GIL_HANG_SIGNAL by sleeping in a C call that keeps the GIL
(the Monarch example's DEADLOCK fault): no thread of it runs Python any more, its liveness
thread goes silent, and its OS state ("sleeping") looks like its peers' waiting in a
collective for it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, ClassVar

from chaos.kinds.base import FaultCategory, FaultKind, ModeOptions
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.faults import GIL_HANG_SIGNAL
from monarch_ft.records.recovered import RESTARTED


@dataclass
class HangOptions(ModeOptions):
    MODES: ClassVar[tuple[str, ...]] = ("sigstop", "gil")


class Hang(FaultKind):
    name = "hang"
    category = FaultCategory.RESTART
    options = HangOptions
    recovery = RESTARTED
    costs_restart = True
    rank_action = "mode gil: answer GIL_HANG_SIGNAL by sleeping with the GIL held (its fault agent, on the main thread)"

    def check(self, fault, cfg, traits, where: str) -> None:
        if fault.mode == "gil" and traits.worker_thread_trainer:
            raise ConfigError(
                f"{where}.mode=gil: {traits.worker_thread_trainer} trains in a worker thread, where the rank cannot answer the gil hang's signal: "
                "use mode: sigstop, or another launcher"
            )

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        sig = GIL_HANG_SIGNAL if fault.mode == "gil" else signal.SIGSTOP
        return {**job.signal_rank(group, fault.rank, sig), "mode": fault.mode}


KIND = Hang()
