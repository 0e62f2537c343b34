"""One fault drill -> drill.json, report.md, timeline.png, mttr.png in the run directory.

monarch-ft drill 'chaos.faults=[{kind: process_kill, at_step: 20, target: 1}, {kind: hang, at_step: 60}]' hydra.run.dir=DIR
monarch-ft drill chaos.schedule=poisson chaos.rate_per_min=4 chaos.count=5 chaos.baseline=true
"""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from chaos.config import register_drill_configs
from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.cli.run import run_dir
from monarch_ft.records.errors import ConfigError

register_drill_configs()


@hydra_main("drill")
def main(cfg: DictConfig) -> None:
    from chaos.drill import drill_ok, run_with_baseline

    out = run_dir()
    from chaos.kinds import fault_kind
    from chaos.schedule import build_faults
    from chaos.watchdog import is_watched, run_watched

    try:
        faults = build_faults(OmegaConf.to_object(cfg.chaos))
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)
    if not is_watched() and (cfg.chaos.on_demand or any(fault_kind(f.kind).ends_this_process for f in faults)):
        # A fault that kills the controller (configured, or one that may be asked for): this process
        # becomes the watchdog that kills and reattaches it.
        from hydra.core.hydra_config import HydraConfig

        from monarch_ft.common import proctitle

        proctitle.set_title(out, proctitle.DRILL_WATCHDOG)
        sys.exit(run_watched(["-m", __spec__.name, *HydraConfig.get().overrides.task], out))
    try:
        drill, baseline = run_with_baseline(OmegaConf.to_object(cfg), out)
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        from chaos.report import write_drill_report
        from monarch_ft.records.reports import ReportTail

        metrics = ReportTail(os.path.join(out, "metrics.jsonl")).read()
        paths = write_drill_report(out, drill, metrics, baseline)
        print(f"[chaos] report: {paths.get('report.md', paths)}")
    except ImportError as e:
        print(f"[chaos] report not written: {e}", file=sys.stderr)
    from chaos.outcome import fix_line

    ok = drill_ok(drill) and (baseline is None or drill_ok(baseline))
    for f in drill["faults"]:
        kind = f["kind"] + (f":{f['mode']}" if f.get("mode") else "")
        if f.get("injected") is False:
            print(f"[chaos] fault {f['id']} {kind}: not injected ({f['not_injected']['reason']}): {f['not_injected']['detail']}")
            continue
        mttr = "n/a" if f["mttr_s"] is None else f"{f['mttr_s']}s"
        blamed = f" blamed=g{f['target']}r{f['blamed_rank']} ({f.get('blame')})" if f.get("blamed_rank") is not None else ""
        why = f.get("not_recovered")
        print(
            f"[chaos] fault {f['id']} {kind} -> group {f['target']}: mttr={mttr} recovered={f['recovered']} path={f.get('recovery_path')} "
            f"weights_consistent={f['weights_consistent']} job_steps_lost={f.get('job_steps_lost', 0)}{blamed}"
            + (f" not recovered ({why['reason']}): {why['detail']}; {why['fix']}" if why else "")
        )
    print(
        f"[chaos] steps_never_go_back={drill['steps_never_go_back']} steps_lost={drill['steps_lost']} "
        f"step_regressions={len(drill['step_regressions'])} exit_code={drill['exit_code']}"
    )
    missing = fix_line(drill["faults"])
    if missing:
        print(f"monarch_ft: error: {missing}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
