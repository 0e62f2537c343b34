"""``training``: the steps, the batch, the optimizer's rate, the device, TorchTitan's memory and speed knobs."""

from __future__ import annotations

from dataclasses import dataclass

from monarch_ft.common.devices import DEVICES
from monarch_ft.records.errors import require

MIXED_PRECISIONS = ("fp32", "bf16")
ACTIVATION_CHECKPOINTS = ("none", "selective", "full")


@dataclass
class TrainingConfig:
    """The training loop every rank runs: steps, batch, AdamW's rate, threads, device."""

    steps: int = 30
    """Committed steps the job trains; every group ends at this step."""

    batch_size: int = 2
    """Sequences per rank per step."""

    seq_len: int = 128
    """Tokens per sequence (also the model's ``max_seq_len``)."""

    lr: float = 8e-4
    """AdamW's peak learning rate (betas 0.9, 0.95), reached after ``warmup_steps`` and then
    decayed linearly to 0 at ``steps`` (TorchTitan's LR scheduler)."""

    warmup_steps: int = 2
    """Steps of linear learning-rate warmup."""

    weight_decay: float = 0.1
    """AdamW's weight decay."""

    seed: int = 0
    """Seeds the initial weights and the data order. Every group uses the same seed, so all start
    from identical weights without an initial sync; a checkpoint written with another seed is refused."""

    threads_per_rank: int = 1
    """torch threads per rank (``torch.set_num_threads``); the ranks share the machine's cores."""

    state_hash_every: int = 0
    """Report a hash of the model and optimizer state every N committed steps (0: only at the
    end); drills use it to check that a rejoined group holds exactly the healthy groups' weights."""

    device: str = "auto"
    """Where ranks train: ``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu``, or ``cuda``
    (refused where torch sees none). See monarch_ft/common/devices.py for the GPU each rank takes."""

    mixed_precision: str = "fp32"
    """``bf16``: FSDP's mixed-precision policy as TorchTitan sets it: parameters all-gathered and
    used in bfloat16, gradients reduced in float32, master weights and AdamW's state float32
    (a group of one rank is wrapped in FSDP for it too). ``fp32``: everything float32."""

    activation_checkpoint: str = "none"
    """TorchTitan's activation checkpointing of each transformer block: ``selective`` (per op:
    keeps every other matmul's output and the attention's, recomputes the rest in backward),
    ``full`` (recomputes the whole block), ``none``. Less memory for activations, more compute."""

    compile: bool = False
    """``torch.compile`` each transformer block (TorchTitan's ``apply_compile``: inductor,
    fullgraph). Every rank, relaunched ones too, compiles while it starts, on a batch of the
    training shape (within ``ft.startup_timeout_s``: raise it where a cold compilation takes
    longer; inductor's on-disk cache makes later ones seconds). On CPU inductor needs a C++
    compiler (gcc) on the machine."""

    def check(self) -> None:
        """What the types cannot say about this section (each failure one line naming the fix)."""
        require(self.steps >= 1, f"training.steps={self.steps}: must be >= 1")
        require(self.batch_size >= 1, f"training.batch_size={self.batch_size}: must be >= 1")
        require(self.seq_len >= 8, f"training.seq_len={self.seq_len}: must be >= 8")
        require(self.lr > 0, f"training.lr={self.lr}: must be > 0")
        require(self.threads_per_rank >= 1, f"training.threads_per_rank={self.threads_per_rank}: must be >= 1")
        require(self.device in DEVICES, f"training.device={self.device!r}: choose one of {', '.join(DEVICES)}")
        require(
            self.mixed_precision in MIXED_PRECISIONS,
            f"training.mixed_precision={self.mixed_precision!r}: choose one of {', '.join(MIXED_PRECISIONS)}",
        )
        require(
            self.activation_checkpoint in ACTIVATION_CHECKPOINTS,
            f"training.activation_checkpoint={self.activation_checkpoint!r}: choose one of {', '.join(ACTIVATION_CHECKPOINTS)}",
        )
