"""The job's whole config: one dataclass per section, and the check of what spans sections.

Each section is its own module (:mod:`.model`, :mod:`.training`, :mod:`.data`, :mod:`.ft`,
:mod:`.checkpoint`, :mod:`.metrics`, :mod:`.controller`, :mod:`.launcher`) and checks its own
values (``check()``); :func:`validate` runs them all and the checks that span sections. What
depends on the machine, the launcher or the installed TorchTitan is judged on the controller
before launch (``monarch_ft.controller.preflight``). The dataclasses are Hydra structured
configs (registered by ``monarch_ft.cli.run``), so a misspelt key or a wrong type in an
override fails at once with Hydra's own message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monarch_ft.config.checkpoint import CheckpointConfig
from monarch_ft.config.controller import ControllerConfig
from monarch_ft.config.data import DataConfig
from monarch_ft.config.ft import FTConfig
from monarch_ft.config.launcher import LauncherConfig
from monarch_ft.config.metrics import MetricsConfig
from monarch_ft.config.model import ModelConfig
from monarch_ft.config.training import TrainingConfig
from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import require


@dataclass
class JobConfig:
    """A training job: what ``recipes/pretrain.py`` takes, and what a drill and the MTTR bench extend."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Which TorchTitan model the ranks train."""

    training: TrainingConfig = field(default_factory=TrainingConfig)
    """The training loop: steps, batch, learning rate, device."""

    data: DataConfig = field(default_factory=DataConfig)
    """What the ranks train on."""

    ft: FTConfig = field(default_factory=FTConfig)
    """The fault tolerance: groups, Lighthouse, timeouts, hang model, restart budget, standbys, sync mode."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Periodic disk checkpoints."""

    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    """How ranks become processes."""

    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """What the ranks record besides their report files."""

    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """The controller's life apart from the job's: attach, detach, the lease."""


def validate(cfg: JobConfig) -> None:
    """Reject what the schema can't, section by section, then across sections: each failure
    is one line naming the fix (:class:`~monarch_ft.records.errors.ConfigError`)."""
    cfg.ft.check()
    cfg.training.check()
    cfg.data.check()
    cfg.metrics.check()
    cfg.checkpoint.check()
    cfg.controller.check()
    ft, tr = cfg.ft, cfg.training
    if ft.mode != "hsdp":
        window = ft.sync_every // ft.fragments
        require(
            tr.steps % window == 0,
            f"training.steps={tr.steps}: ft.mode={ft.mode} syncs every {window} steps; use a multiple of {window} "
            "(steps after the last sync would never be averaged)",
        )
    if tr.device == "cpu":
        refuse_unused(ft, "ft", ("nccl_hostid_per_group",), "with training.device=cpu (no NCCL)", "drop it")
