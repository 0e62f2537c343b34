"""Fault-tolerant pretraining launch.

    monarch-ft pretrain ft.replica_groups=2 ft.ranks_per_group=2 training.steps=30 hydra.run.dir=DIR

Writes DIR/events.jsonl, DIR/metrics.jsonl and DIR/summary.json.
"""

from __future__ import annotations

from omegaconf import DictConfig

from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.cli.run import run_job


@hydra_main("pretrain")
def main(cfg: DictConfig) -> int:
    return run_job(cfg)


if __name__ == "__main__":
    main()
