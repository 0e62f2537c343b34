"""``training``: the steps, the batch, the optimizer's rate, the device."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.common.devices import DEVICES
from monarch_ft.records.errors import require


@dataclass
class TrainingConfig:
    steps: int = 30
    batch_size: int = 2
    seq_len: int = 128
    lr: float = 8e-4
    warmup_steps: int = 2
    weight_decay: float = 0.1
    seed: int = 0
    # torch threads per rank; ranks share the machine's cores.
    threads_per_rank: int = 1
    # Report a state hash every N committed steps (0: only at the end); drills use it
    # to check that a rejoined group holds exactly the healthy groups' weights.
    state_hash_every: int = 0
    # auto: CUDA when torch sees a GPU, else CPU; cpu; cuda (refused where torch sees none).
    # See monarch_ft/common/devices.py for the GPU each rank takes.
    device: str = "auto"

    def check(self) -> None:
        """What the types cannot say about this section (each failure one line naming the fix)."""
        require(self.steps >= 1, f"training.steps={self.steps}: must be >= 1")
        require(self.batch_size >= 1, f"training.batch_size={self.batch_size}: must be >= 1")
        require(self.seq_len >= 8, f"training.seq_len={self.seq_len}: must be >= 8")
        require(self.lr > 0, f"training.lr={self.lr}: must be > 0")
        require(self.threads_per_rank >= 1, f"training.threads_per_rank={self.threads_per_rank}: must be >= 1")
        require(self.device in DEVICES, f"training.device={self.device!r}: choose one of {', '.join(DEVICES)}")
