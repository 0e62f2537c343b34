"""Periodic disk checkpoints through TorchTitan's own CheckpointManager (DCP).

Each replica group writes its own folder (``<run>/checkpoint/group_<g>``): a group's
checkpoints are that host's local files, so a node fault can take them away while
the other groups' copies survive. TorchFT healing does not need them; they are for
resuming a whole job from disk (``checkpoint.resume=true``).
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

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


def newest_complete_step(folders: list[str], at_most: Optional[int] = None) -> Optional[int]:
    """The newest step any of ``folders`` holds complete (not after ``at_most``), or None."""
    return max((s for folder in folders for s in complete_steps(folder) if at_most is None or s <= at_most), default=None)


def align_latest_checkpoint(folders: list[str], at_most: Optional[int] = None) -> Optional[int]:
    """Make the newest complete step of any folder (not after ``at_most``) present in every folder.

    A group resuming from disk, and every group of a full-job restart, load one step.
    Groups of an HSDP job hold the same state at a committed step, so a group whose
    folder lacks that step (it died before saving it, or its node lost its files) gets
    a copy, as it would read it from shared storage. Returns the step, or None when no
    folder has a checkpoint. ``at_most`` keeps an older job's checkpoints left in the
    same folders (steps beyond what this job committed) out of the choice.
    """
    newest = newest_complete_step(folders, at_most)
    if newest is None:
        return None
    steps = {folder: complete_steps(folder) for folder in folders}
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


class SaveWatchdog:
    """Bounds a checkpoint save and tells the supervisor while one runs.

    A save reports nothing until it ends, so the rank says when it enters and leaves one
    (``checkpoint_save_started`` / ``checkpoint_saved``) and the supervisor's hang detector
    allows it ``timeout_s`` instead of ``ft.hang_timeout_s``. A save still running after
    ``timeout_s`` is stuck, not slow: the watchdog writes every thread's stack to
    ``stacks_path``, reports ``checkpoint_save_timeout`` and ends the rank with
    ``RankExit.SAVE_TIMEOUT``, so the failure is named and its cause is on disk.

    Args:
        timeout_s: ``checkpoint.save_timeout_s``.
        report: the rank reporter's ``event``.
        stacks_path: where the stacks go on a timeout.
        on_timeout: what ends the rank (``os._exit`` by default; tests pass their own).
    """

    def __init__(self, timeout_s: float, report: Callable[..., None], stacks_path: str, on_timeout: Optional[Callable[[int], None]] = None) -> None:
        self.timeout_s = timeout_s
        self._report = report
        self.stacks_path = stacks_path
        self._on_timeout = on_timeout or os._exit

    def _expired(self, step: int, started: float) -> None:
        from monarch_ft.launcher.base import RankExit

        os.makedirs(os.path.dirname(self.stacks_path), exist_ok=True)
        with open(self.stacks_path, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        self._report("checkpoint_save_timeout", step=step, seconds=round(time.time() - started, 3), timeout_s=self.timeout_s, stacks=self.stacks_path)
        self._on_timeout(int(RankExit.SAVE_TIMEOUT))

    @contextmanager
    def guard(self, step: int) -> Iterator[None]:
        started = time.time()
        self._report("checkpoint_save_started", step=step, timeout_s=self.timeout_s)
        timer = threading.Timer(self.timeout_s, self._expired, args=(step, started))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        self._report("checkpoint_saved", step=step, seconds=round(time.time() - started, 3))


def save_due(step: int, interval: int, last_step: bool) -> bool:
    """Whether TorchTitan's CheckpointManager.save will write at ``step`` (its own rule)."""
    return last_step or step % interval == 0


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
