"""``checkpoint``: periodic disk checkpoints (``monarch_ft.rank.components.checkpoint``)."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import require


@dataclass
class CheckpointConfig:
    """Periodic disk checkpoints through TorchTitan's CheckpointManager (DCP)."""

    enable: bool = True
    """Save disk checkpoints. Live recovery heals a group from a peer without them; they are what
    a full restart, ``resume`` and a job that lost every replica resume from. false: the other
    keys of this section must stay at their defaults (they would do nothing)."""

    interval: int = 10
    """Committed steps between two saves (the last step is always saved)."""

    folder: str = "checkpoint"
    """Where the saves go, relative to the run directory; each group writes under ``<folder>/group_<g>``."""

    keep_latest_k: int = 2
    """Saves kept per group, older ones purged (0: keep all). Not 1, which TorchTitan refuses: the
    newest save may still be in progress, so a purge must leave an older complete one."""

    resume: bool = False
    """Resume every group from the newest intact disk checkpoint any group saved, at launch (needs ``enable``)."""

    save_timeout_s: float = 120.0
    """Seconds a save may take before it counts as stuck: the rank dumps its stacks, reports
    ``checkpoint_save_timeout`` and exits. While a rank is saving, the controller's hang detector
    allows it this long (not ``ft.hang_timeout_s``)."""

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
        if not self.enable:
            refuse_unused(
                self,
                "checkpoint",
                ("interval", "folder", "keep_latest_k", "resume", "save_timeout_s", "scrub_every_s"),
                "with checkpoint.enable=false (nothing is saved or loaded)",
                "drop it, or set checkpoint.enable=true",
            )
