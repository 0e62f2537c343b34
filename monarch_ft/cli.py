"""What every recipe does with its Hydra config: validate, run the supervisor, exit.

Errors a user can fix (bad values, a port in use, an unreachable Lighthouse) end
the process with one line on stderr and exit code 2; the job's own exit code
otherwise (0 when every group finished).
"""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from monarch_ft.records.errors import ConfigError
from monarch_ft.config import JobConfig, register_configs

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

register_configs()


def run_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def to_job_config(cfg: DictConfig) -> JobConfig:
    return OmegaConf.to_object(cfg)


def run_job(cfg: DictConfig, hooks=None) -> int:
    from monarch_ft.controller.loop import Supervisor

    try:
        supervisor = Supervisor(to_job_config(cfg), run_dir(), hooks=hooks)
        code = supervisor.run()
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)
