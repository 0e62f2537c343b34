"""Periodic disk checkpoints through TorchTitan's own CheckpointManager (DCP).

Each replica group writes its own folder (``<run>/checkpoint/group_<g>``): a group's
checkpoints are that host's local files, so a node fault can take them away while
the other groups' copies survive. TorchFT healing does not need them; they are for
resuming a whole job from disk (``checkpoint.resume=true``).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Optional

from monarch_ft.config import CheckpointConfig


_STEP_DIR = re.compile(r"^step-(\d+)$")


def complete_steps(folder: str) -> set[int]:
    """Steps with a finished DCP save in ``folder`` (DCP writes ``.metadata`` last)."""
    if not os.path.isdir(folder):
        return set()
    found = set()
    for name in os.listdir(folder):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(folder, name, ".metadata")):
            found.add(int(m.group(1)))
    return found


def align_latest_checkpoint(folders: list[str]) -> Optional[int]:
    """Make the newest complete step of any folder the latest of every folder.

    A full-job restart resumes every group from one step. Groups of an HSDP job hold
    the same state at a committed step, so a group whose folder lacks that step (it
    died before saving it, or its node lost its files) gets a copy, as it would read
    it from shared storage. Returns the step, or None when no folder has a checkpoint.
    """
    steps = {folder: complete_steps(folder) for folder in folders}
    newest = max((max(s) for s in steps.values() if s), default=None)
    if newest is None:
        return None
    name = f"step-{newest}"
    source = next(folder for folder, s in steps.items() if newest in s)
    for folder, have in steps.items():
        if newest in have:
            continue
        os.makedirs(folder, exist_ok=True)
        incoming = os.path.join(folder, f".incoming-{newest}")  # not a step-N name until complete
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.copytree(os.path.join(source, name), incoming)
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)  # an unfinished save
        os.rename(incoming, os.path.join(folder, name))
    return newest


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
