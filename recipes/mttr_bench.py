"""MTTR benchmark: a Hydra multirun sweep over fault kinds x recovery modes.

    python recipes/mttr_bench.py -m bench.kind=process_kill,hang,node,collective ft.recovery=live,full_restart
    python recipes/mttr_bench.py -m bench.kind=process_kill ft.mode=hsdp,localsgd,diloco ft.sync_every=10

Each job runs one drill (``bench.repeats`` faults of ``bench.kind``) in its own
directory; after every job the aggregate report over all drills found in the sweep
directory is rewritten, so when the sweep ends ``<sweep>/report.md``, ``mttr.png``
and ``summary.json`` compare every kind, ours against full restart.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hydra.core.config_store import ConfigStore  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from chaos.config import ChaosConfig, DrillConfig, FaultConfig  # noqa: E402
from monarch_ft.hydra_entry import hydra_main  # noqa: E402
from monarch_ft.config import ConfigError  # noqa: E402


@dataclass
class BenchConfig:
    kind: str = "process_kill"
    repeats: int = 2
    first_step: int = 10
    every_steps: int = 15


@dataclass
class MTTRBenchConfig(DrillConfig):
    bench: BenchConfig = field(default_factory=BenchConfig)


ConfigStore.instance().store(name="mttr_bench_schema", node=MTTRBenchConfig)


@hydra_main("mttr_bench")
def main(cfg: DictConfig) -> None:
    from chaos.drill import drill_ok, run_drill
    from chaos.report import write_aggregate_report

    job: MTTRBenchConfig = OmegaConf.to_object(cfg)
    b = job.bench
    job.chaos = ChaosConfig(
        faults=[FaultConfig(kind=b.kind, at_step=b.first_step + i * b.every_steps) for i in range(b.repeats)],
        seed=job.chaos.seed,
        recovery_timeout_s=job.chaos.recovery_timeout_s,
    )
    hc = HydraConfig.get()
    out = hc.runtime.output_dir
    try:
        drill = run_drill(job, out)
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)  # a config error is the same for every job: stop the sweep
    multirun = hc.mode.name == "MULTIRUN"
    sweep_dir = hc.sweep.dir if multirun else out
    drills = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sweep_dir, "**", "drill.json"), recursive=True))]
    paths = write_aggregate_report(sweep_dir, drills)
    print(f"[mttr_bench] {b.kind}/{job.ft.recovery}/{job.ft.mode}: " + ", ".join(f"mttr={f['mttr_s']}" for f in drill["faults"]))
    print(f"[mttr_bench] aggregate over {len(drills)} drills: {paths['report']}")
    ok = drill_ok(drill)
    if not ok:
        print(f"[mttr_bench] {b.kind}/{job.ft.recovery}: a fault did not recover cleanly, see {out}/drill.json", file=sys.stderr)
    # sys.exit inside a multirun job would end the whole sweep: only a single run exits.
    if not multirun:
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
