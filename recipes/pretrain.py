"""Fault-tolerant pretraining launch.

    python recipes/pretrain.py ft.replica_groups=2 ft.ranks_per_group=2 training.steps=30 hydra.run.dir=DIR

Writes DIR/events.jsonl, DIR/metrics.jsonl and DIR/summary.json.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from omegaconf import DictConfig  # noqa: E402

from monarch_ft.cli.hydra_entry import hydra_main  # noqa: E402
from monarch_ft.cli.run import run_job  # noqa: E402


@hydra_main("pretrain")
def main(cfg: DictConfig) -> int:
    return run_job(cfg)


if __name__ == "__main__":
    main()
