"""A key that would do nothing in the mode the rest of the config selects is refused in one line
naming the fix (exit 2), never silently ignored (monarch_ft.config.unused).

Why: ``ft.fragments=4`` under ``ft.mode=hsdp`` reads as streaming DiLoCo; training plain HSDP
instead without a word would cost a run to find out.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from chaos.config import ChaosConfig, DrillConfig, FaultConfig, validate_chaos
from monarch_ft.config.ft import FTConfig
from monarch_ft.config.job import JobConfig, validate
from monarch_ft.config.unused import changed, refuse_unused
from monarch_ft.records.errors import ConfigError
from monarch_ft.testing.jobs import PRETRAIN, REPO, config_refusal


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            "data.corpus=wikipedia",
            "data.corpus=wikipedia: the only built-in corpus is stdlib (the standard library's sources); to train on your own text or token ids give data.path",
        ),
        ("ft.fragments=4", "ft.fragments=4: fragments (streaming DiLoCo) need ft.mode=diloco"),
        ("ft.mode=localsgd ft.sync_every=10 training.steps=30 ft.fragments=2", "ft.fragments=2: fragments (streaming DiLoCo) need ft.mode=diloco"),
        (
            "ft.recovery=full_restart ft.standby_groups=1",
            "ft.standby_groups=1 has no effect with ft.recovery=full_restart (it relaunches every group from disk, with no standby)",
        ),
        (
            "ft.lighthouse_addr=127.0.0.1:9 ft.lighthouse_port=29510",
            "ft.lighthouse_port=29510 has no effect with ft.lighthouse_addr=127.0.0.1:9 (they configure the Lighthouse the controller starts",
        ),
        ("ft.lighthouse_addr=127.0.0.1:9 ft.join_timeout_ms=200", "ft.join_timeout_ms=200 has no effect with ft.lighthouse_addr=127.0.0.1:9"),
        (
            "ft.transport=http ft.transport_interface=lo",
            "ft.transport_interface=lo has no effect with ft.transport=http (only the sharded transport binds where it says): drop it, or use",
        ),
        ("ft.cross_group_backend=gloo ft.nccl_hostid_per_group=true", "ft.nccl_hostid_per_group=true has no effect with ft.cross_group_backend=gloo"),
        ("training.device=cpu ft.nccl_hostid_per_group=true", "ft.nccl_hostid_per_group=true has no effect with training.device=cpu (no NCCL): drop it"),
        (
            "checkpoint.enable=false checkpoint.resume=true",
            "checkpoint.resume=true has no effect with checkpoint.enable=false (nothing is saved or loaded): drop it, or set checkpoint.enable=true",
        ),
        ("checkpoint.enable=false checkpoint.interval=5", "checkpoint.interval=5 has no effect with checkpoint.enable=false"),
        (
            "metrics.tensorboard_flush_s=5",
            "metrics.tensorboard_flush_s=5.0 has no effect with metrics.tensorboard=false: drop it, or set metrics.tensorboard=true",
        ),
        (
            "launcher=slurm launcher.max_ranks_per_core=8",
            "launcher.max_ranks_per_core=8 has no effect with launcher=slurm (its ranks run on other machines): drop it",
        ),
        (
            "launcher=monarch launcher.options.slurm.nodes_per_group=2",
            "launcher.options.slurm.nodes_per_group=2 has no effect with launcher.options.allocator=local (no Slurm job is made)",
        ),
    ],
)
def test_a_key_with_no_effect_is_refused(tmp_path, overrides, expected):
    assert expected in config_refusal(tmp_path, overrides)


def test_the_same_keys_pass_where_they_act(tmp_path):
    cfg = JobConfig()
    cfg.ft.mode, cfg.ft.sync_every, cfg.ft.fragments, cfg.ft.outer_lr, cfg.ft.outer_nesterov = "diloco", 10, 2, 0.5, False
    cfg.training.steps = 30
    cfg.ft.recovery, cfg.ft.standby_groups = "full_restart", 0  # off is what full_restart does anyway
    cfg.checkpoint.resume = True
    cfg.metrics.tensorboard, cfg.metrics.tensorboard_flush_s = True, 5.0
    cfg.ft.nccl_hostid_per_group = True  # training.device=auto: judged by the pre-flight, which knows the devices
    validate(cfg)
    # Setting a key to its default is not "setting" it: a dataclass cannot tell, and it is harmless.
    cfg = JobConfig()
    cfg.ft.transport, cfg.ft.transport_interface = "http", FTConfig().transport_interface
    validate(cfg)
    # The sync knobs are kept in every mode: one sweep across modes sets them for all.
    cfg.ft.sync_every, cfg.ft.outer_lr = 10, 0.5
    validate(cfg)


def test_refuse_unused_names_the_first_key_set():
    ft = FTConfig()
    assert not changed(ft, "sync_every")
    ft.sync_every, ft.outer_lr, ft.outer_nesterov = 5, 0.1, False
    assert changed(ft, "sync_every") and changed(ft, "outer_lr")
    with pytest.raises(ConfigError, match=r"^ft.outer_lr=0.1 has no effect because: fix$"):
        refuse_unused(ft, "ft", ("outer_momentum", "outer_lr", "sync_every"), "because", "fix")
    with pytest.raises(ConfigError, match=r"^ft.outer_nesterov=false has no effect"):
        refuse_unused(ft, "ft", ("outer_nesterov",), "because", "fix")


def test_the_drill_refuses_the_poisson_keys_without_the_poisson_schedule():
    cfg = DrillConfig()
    faults = [FaultConfig(kind="process_kill", at_step=5)]
    cfg.chaos = ChaosConfig(rate_per_min=5.0)
    with pytest.raises(
        ConfigError,
        match=r"^chaos.rate_per_min=5.0 has no effect with chaos.schedule=none \(only chaos.faults are injected\): drop it, or add chaos.schedule=poisson$",
    ):
        validate_chaos(cfg, faults)
    cfg.chaos = ChaosConfig(kinds=["hang"])
    with pytest.raises(ConfigError, match=r"^chaos.kinds=\['hang'\] has no effect with chaos.schedule=none"):
        validate_chaos(cfg, faults)
    cfg.chaos = ChaosConfig(schedule="poisson", count=1, kinds=["hang"], rate_per_min=5.0)
    validate_chaos(cfg, faults)


def test_a_full_restart_drill_refuses_a_full_restart_baseline():
    cfg = DrillConfig()
    cfg.chaos = ChaosConfig(baseline=True)
    faults = [FaultConfig(kind="process_kill", at_step=5)]
    validate_chaos(cfg, faults)
    cfg.ft.recovery = "full_restart"
    with pytest.raises(ConfigError, match=r"^chaos.baseline=true has no effect with ft.recovery=full_restart \(the drill is the full-restart baseline\)"):
        validate_chaos(cfg, faults)


def test_a_drill_with_standbys_keeps_its_baseline_runnable():
    """chaos.baseline reruns the faults under ft.recovery=full_restart, which refuses a standby: the
    baseline drops the live run's ft.standby_groups rather than fail after the live run."""
    from chaos.drill import baseline_config

    cfg = DrillConfig()
    cfg.ft.standby_groups, cfg.chaos.baseline = 1, True
    base = baseline_config(cfg)
    validate(base)
    assert base.ft.recovery == "full_restart" and cfg.ft.standby_groups == 1 and cfg.ft.recovery == "live"


def _bench():
    return importlib.import_module("monarch_ft.recipes.mttr_bench")


@pytest.mark.parametrize(
    "key, value, expected",
    [
        (
            "ft.recovery",
            "full_restart",
            "ft.recovery has no effect in the MTTR bench (each of bench.modes sets it: live_standby, live_fork, live, full_restart): drop it",
        ),
        ("ft.standby_groups", 2, "ft.standby_groups has no effect in the MTTR bench (each of bench.modes sets it"),
        ("ft.warm_fork", False, "ft.warm_fork has no effect in the MTTR bench"),
        (
            "chaos.faults",
            [{"kind": "hang", "at_step": 3}],
            "chaos.faults has no effect in the MTTR bench (its faults come from bench.kinds, bench.repeats, bench.first_step and bench.every_steps): drop it",
        ),
        ("chaos.schedule", "poisson", "chaos.schedule has no effect in the MTTR bench"),
        ("chaos.baseline", True, "chaos.baseline has no effect in the MTTR bench"),
    ],
)
def test_the_bench_refuses_what_its_modes_and_kinds_set(key, value, expected):
    bench = _bench()
    job = bench.MTTRBenchConfig()
    job.bench.kinds, job.bench.modes = ["process_kill"], ["live"]
    section, name = key.split(".")
    setattr(getattr(job, section), name, value)
    with pytest.raises(ConfigError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        bench.plan(job)


def test_the_bench_refuses_such_a_key_given_at_its_default_and_keeps_the_drill_keys():
    bench = _bench()
    job = bench.MTTRBenchConfig()
    job.bench.kinds, job.bench.modes = ["process_kill"], ["live"]
    # ft.recovery=live is the default value, but given on the command line it still reads as a request.
    assert "ft.recovery has no effect in the MTTR bench" in bench.bench_config_problem(job, ["ft.recovery=live"])
    assert bench.bench_config_problem(job, ["ft.mode=diloco", "chaos.seed=3", "+chaos.allow_last_healthy=true"]) is None
    # chaos.allow_last_healthy acts in every drill of the sweep (it was dropped before).
    job.chaos.allow_last_healthy, job.chaos.seed = True, 7
    (drill,) = [cfg for _, _, cfg in bench.plan(job)[0]]
    assert drill.chaos.allow_last_healthy and drill.chaos.seed == 7


def test_a_refusal_through_the_recipe_is_one_line_and_exit_2(tmp_path):
    """End to end: the recipe prints the refusal as its only error line and exits 2, launching nothing."""
    import subprocess

    res = subprocess.run(
        [sys.executable, str(PRETRAIN), "ft.fragments=4", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert [line for line in out.splitlines() if line.startswith("monarch_ft: error:")] == [
        "monarch_ft: error: ft.fragments=4: fragments (streaming DiLoCo) need ft.mode=diloco"
    ], out
    assert "Traceback" not in out and not (tmp_path / "run" / "logs").exists()
