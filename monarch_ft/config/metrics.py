"""``metrics``: what the ranks record besides their report files."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import require


@dataclass
class MetricsConfig:
    """What the ranks record besides their report files (which the supervisor always reads)."""

    tensorboard: bool = False
    """Write TensorBoard event files, one run per replica group (``<run>/tensorboard/group_<g>``,
    written by the group's rank 0): loss, lr, tokens/s, step time, quorum size, and a marker at
    every restart, heal, disk load, quorum change, failed commit and fault
    (monarch_ft/rank/components/tensorboard.py). View: ``tensorboard --logdir <run>/tensorboard``."""

    tensorboard_flush_s: float = 1.0
    """Seconds between flushes of the event files: the curve a killed rank can lose (markers are flushed at once)."""

    def check(self) -> None:
        """What the types cannot say about this section (one line naming the fix)."""
        require(self.tensorboard_flush_s > 0, f"metrics.tensorboard_flush_s={self.tensorboard_flush_s}: must be > 0")
        if not self.tensorboard:
            refuse_unused(self, "metrics", ("tensorboard_flush_s",), "with metrics.tensorboard=false", "drop it, or set metrics.tensorboard=true")
