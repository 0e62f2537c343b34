"""Periodic disk checkpoints through TorchTitan's own CheckpointManager (DCP).

Each replica group writes its own folder (``<run>/checkpoint/group_<g>``): a group's
checkpoints are that host's local files, so a node fault can take them away while
the other groups' copies survive. TorchFT healing does not need them; they are for
resuming a whole job from disk (``checkpoint.resume=true``).
"""

from __future__ import annotations

import os
from typing import Any

from monarch_ft.config import CheckpointConfig


class TrainState:
    """Steps trained, saved beside the model so a resumed job knows where it is."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class DataCursor:
    """The data order is a pure function of (seed, step, group, rank): only the seed is state."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was written with training.seed={state['seed']}, this run has {self.seed}")


def build_checkpointer(cfg: CheckpointConfig, run_dir: str, group: int, model, optimizers, lr_schedulers, states: dict, seed: int):
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config.job_config import Checkpoint

    tt_cfg = Checkpoint(
        enable=cfg.enable,
        folder=f"group_{group}",
        interval=cfg.interval,
        keep_latest_k=cfg.keep_latest_k,
        async_mode="disabled",
        # The last save keeps optimizer state too, so a job can resume from it.
        last_save_model_only=False,
        enable_ft_dataloader_checkpoints=False,
    )
    return CheckpointManager(
        dataloader=DataCursor(seed),
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states=states,
        checkpoint_config=tt_cfg,
        sd_adapter=None,
        base_folder=os.path.join(run_dir, cfg.folder),
        ft_manager=None,
    )
