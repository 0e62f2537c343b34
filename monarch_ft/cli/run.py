"""What every recipe does with its Hydra config: validate, run the supervisor, exit.

Errors a user can fix (bad values, a port in use, an unreachable Lighthouse) end
the process with one line on stderr and exit code 2; the job's own exit code
otherwise (0 when every group finished).
"""

from __future__ import annotations

import os
import sys

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from monarch_ft.config.ft import FTConfig
from monarch_ft.config.job import JobConfig
from monarch_ft.config.launcher import LauncherConfig
from monarch_ft.config.model import ModelConfig
from monarch_ft.controller.preflight import preflight
from monarch_ft.launcher import options_types
from monarch_ft.records.errors import ConfigError

# The recipes' configs ship inside the package (package data): Hydra's primary config
# directory, from a checkout or an install alike. A user's own directory is added to Hydra's
# search path with --config-dir.
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def register_configs() -> None:
    """Register the schemas so YAML files under monarch_ft/configs/ are validated against them."""
    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=JobConfig)
    cs.store(group="model", name="schema", node=ModelConfig)
    cs.store(group="ft", name="schema", node=FTConfig)
    # One schema per launcher (launcher/<name>_schema): its options typed by the launcher's own dataclass.
    for name, options in options_types().items():
        cs.store(group="launcher", name=f"{name}_schema", node=LauncherConfig(name=name, options=options()))


register_configs()


def run_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def to_job_config(cfg: DictConfig) -> JobConfig:
    return OmegaConf.to_object(cfg)


def run_job(cfg: DictConfig, hooks=None) -> int:
    try:
        job = to_job_config(cfg)
        if not job.controller.attach:
            # A bad config is told before the controller's own imports (numpy, the data
            # pipeline: a third of a second): the Supervisor checks it again, cheaply. Not on
            # attach, where the job's saved config is the one that counts (Takeover.attach_config).
            preflight(job)
        from monarch_ft.controller.loop import Supervisor

        supervisor = Supervisor(job, run_dir(), hooks=hooks)
        code = supervisor.run()
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)
