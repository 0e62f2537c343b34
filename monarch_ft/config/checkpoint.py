"""``checkpoint``: periodic disk checkpoints (``monarch_ft.rank.components.checkpoint``)."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.records.errors import require


@dataclass
class CheckpointConfig:
    """Periodic disk checkpoints through TorchTitan's CheckpointManager (DCP)."""

    enable: bool = True
    interval: int = 10
    # Relative to the run directory; each group writes under <folder>/group_<g>.
    folder: str = "checkpoint"
    keep_latest_k: int = 2
    # Resume every group from its latest disk checkpoint at launch.
    resume: bool = False
    # A save that takes longer is stuck: the rank dumps its stacks, reports
    # checkpoint_save_timeout and exits. While a rank is saving, the supervisor's hang
    # detector allows it this long (not ft.hang_timeout_s).
    save_timeout_s: float = 120.0
    scrub_every_s: float = 0.0
    """Seconds between reads of every kept step of every group against its manifest (file
    checksums) and against the fingerprint the replicas agreed on at its step, in the
    controller's background; a damaged copy is quarantined when found, not when a recovery
    needs it. 0: only on the recovery path. It reads every byte kept: mind the storage."""

    def check(self) -> None:
        """What the types cannot say about this section (each failure one line naming the fix)."""
        require(self.interval >= 1, f"checkpoint.interval={self.interval}: must be >= 1")
        require(self.save_timeout_s > 0, f"checkpoint.save_timeout_s={self.save_timeout_s}: must be > 0")
        require(self.scrub_every_s >= 0, f"checkpoint.scrub_every_s={self.scrub_every_s}: must be >= 0 (0: no scrub)")
        require(
            self.keep_latest_k == 0 or self.keep_latest_k >= 2,
            f"checkpoint.keep_latest_k={self.keep_latest_k}: use 0 (keep all) or >= 2",
        )
