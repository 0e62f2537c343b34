"""Fault-tolerant pretraining launch.

    python recipes/pretrain.py ft.replica_groups=2 ft.ranks_per_group=2 training.steps=30 hydra.run.dir=DIR

Writes DIR/events.jsonl, DIR/metrics.jsonl and DIR/summary.json.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from monarch_ft.cli import CONFIG_DIR, run_job  # noqa: E402


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="pretrain")
def main(cfg: DictConfig) -> int:
    return run_job(cfg)


if __name__ == "__main__":
    main()
