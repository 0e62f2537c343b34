"""Bad input fails at once with one clear line and a non-zero exit: never a hang.

The config's own checks (monarch_ft.config), the controller's pre-flight
(monarch_ft.controller.preflight) and Hydra's composition (monarch_ft.cli.hydra_entry).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import PRETRAIN, REPO, config_refusal


def _run(tmp_path, *overrides, timeout=60):
    res = subprocess.run(
        [sys.executable, str(PRETRAIN), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return res.returncode, res.stdout + res.stderr


def _assert_one_error_line(code: int, out: str, expected: str) -> None:
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and expected in errors[0], out


@pytest.mark.parametrize(
    "override, expected",
    [
        ("ft.replica_groups=0", "ft.replica_groups=0: need at least 1 replica group"),
        ("ft.ranks_per_group=-1", "ft.ranks_per_group=-1"),
        ("ft.transport=carrier_pigeon", "ft.transport='carrier_pigeon': choose one of sharded, http"),
        ("ft.transport=pg", "ft.transport=pg: TorchFT's PGTransport"),
        ("training.steps=0", "training.steps=0: must be >= 1"),
        ("ft.replica_groups=64", "exceed what this machine can run"),
        ("launcher.name=carrier_pigeon", "launcher='carrier_pigeon': choose one of"),
        ("training.device=tpu", "training.device='tpu': choose one of auto, cpu, cuda"),
        ("ft.cross_group_backend=mpi", "ft.cross_group_backend='mpi': choose one of auto, nccl, gloo"),
        ("training.device=cpu ft.cross_group_backend=nccl", "ft.cross_group_backend=nccl needs CUDA"),
        ("ft.hang_timeout_s=soon", "ft.hang_timeout_s='soon': use auto or a number of seconds"),
        # The training data is checked on the controller before anything starts (tests/unit/test_data.py: every case).
        ("data.path=/nonexistent/tokens.npy", "data.path=/nonexistent/tokens.npy: no such file"),
        ("ft.standby_groups=-1", "ft.standby_groups=-1: must be >= 0"),
        ("ft.restart_window_s=0", "ft.restart_window_s=0.0: must be > 0"),
        ("ft.heartbeat_interval_ms=100 ft.heartbeat_timeout_ms=200", "ft.heartbeat_timeout_ms=200: must be at least 4 x ft.heartbeat_interval_ms=100"),
        ("ft.heartbeat_interval_ms=-5", "ft.heartbeat_interval_ms=-5: must be > 0"),
        ("ft.global_batch=grow", "ft.global_batch='grow': choose one of auto, constant, shrink"),
        ("ft.mode=diloco ft.sync_every=10 ft.global_batch=constant", "ft.global_batch=constant needs ft.mode=hsdp: with ft.mode=diloco"),
        ("training.mixed_precision=fp16", "training.mixed_precision='fp16': choose one of fp32, bf16"),
        ("training.activation_checkpoint=op", "training.activation_checkpoint='op': choose one of none, selective, full"),
        ("model.n_kv_heads=3", "model.n_kv_heads=3 does not divide model.n_heads=16"),
        ("model.n_heads=7", "model.n_heads=7 does not divide model.dim=256"),
        ("data.text_column=body", "data.text_column=body has no effect without a dataset as data.path"),
        # The user's tokenizer and dataset: every case in tests/unit/test_user_data.py.
        ("data.tokenizer=/nonexistent/tokenizer.json", "data.tokenizer=/nonexistent/tokenizer.json: no such file"),
    ],
)
def test_bad_values_fail_with_one_line(tmp_path, override, expected):
    assert expected in config_refusal(tmp_path, override)


@pytest.mark.parametrize(
    "override, expected",
    [
        # Judged when the Lighthouse is reached, after the checks above.
        ("ft.lighthouse_addr=http://127.0.0.1:9", "cannot reach the Lighthouse at http://127.0.0.1:9"),
        # A check of the supervisor's constructor (above), end to end through the recipe.
        ("model.flavor=nonsense", "model.flavor='nonsense' is not a llama3 flavor: choose one of 405B, 70B, 8B"),
    ],
)
def test_bad_values_through_the_recipe_are_one_line_and_exit_2(tmp_path, override, expected):
    code, out = _run(tmp_path, *override.split())
    _assert_one_error_line(code, out, expected)
    assert "Traceback" not in out
    assert not list(tmp_path.glob("run/logs/g*")), "no rank may be launched"


def _check(config_name, *argv, capsys):
    """check_command_line in this process (what the recipes run before hydra.main): (exit code, stderr)."""
    from monarch_ft.cli.hydra_entry import check_command_line

    with pytest.raises(SystemExit) as e:
        check_command_line(config_name, list(argv))
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("ft.no_such_key=1", "ft.no_such_key=1: no such key (Key 'no_such_key' not in 'FTConfig'); ft has: replica_groups, ranks_per_group,"),
        ("ft.replica_groups=two", "ft.replica_groups=two: Value 'two' of type 'str' could not be converted to Integer"),
        ("model=no_such_model", "Could not find 'model/no_such_model' Available options in 'model': debugmodel, llama3_1b, llama3_8b, tiny"),
        ("ft.replica_groups=[1", "no viable alternative at input '[1'"),
        # "+" adds a key even to a schema: one the schema lacks is refused, not silently carried.
        ("+ft.nokey=3", "+ft.nokey=3: no such key (Key 'nokey' not in 'FTConfig'); ft has: replica_groups,"),
        ("+nokey=3", "+nokey=3: no such key (Key 'nokey' not in 'JobConfig'); the config has: model, training, data, ft,"),
        # Launcher options: a typed node of Hydra's launcher group each.
        ("launcher.options.nope=1", "launcher.options.nope=1: no such key (Key 'nope' not in 'Options'); launcher.options has: simulated_hosts"),
        ("+launcher.options.bogus=1", "+launcher.options.bogus=1: no such key (Key 'bogus' not in 'Options'); launcher.options has: simulated_hosts"),
        ("launcher=slurm launcher.options.cpus_per_task=abc", "launcher.options.cpus_per_task=abc: Value 'abc' of type 'str' could not be converted"),
        ("launcher=monarch launcher.options.slurm.nodez=2", "slurm.nodez=2: no such key (Key 'nodez' not in 'SlurmJobOptions'); launcher.options.slurm has:"),
        ("launcher=carrier_pigeon", "Could not find 'launcher/carrier_pigeon' Available options in 'launcher': local, local_hosts, monarch, slurm"),
    ],
)
def test_what_hydra_cannot_compose_is_one_line(capsys, overrides, expected):
    """Unknown keys, wrong types, missing group options, unparsable overrides: one line naming the
    key and what its section has, exit 2 (the recipes run this check before hydra.main)."""
    code, err = _check("pretrain", *overrides.split(), "hydra.run.dir=/nonexistent/run", capsys=capsys)
    _assert_one_error_line(code, err, expected)


def test_a_config_that_composes_passes_the_check():
    from monarch_ft.cli.hydra_entry import check_command_line

    check_command_line("pretrain", ["model=tiny", "launcher=slurm", "launcher.options.cpus_per_task=2", "ft.replica_groups=3", "hydra.run.dir=/x"])
    check_command_line("pretrain", ["-m", "ft.mode=hsdp,diloco", "++launcher.options.simulated_hosts=true"])


def test_drill_and_bench_configs_are_checked_the_same_way(capsys):
    import importlib.util

    from chaos.config import register_drill_configs

    register_drill_configs()
    code, err = _check("drill", "chaos.nope=1", capsys=capsys)
    _assert_one_error_line(code, err, "chaos.nope=1: no such key")
    importlib.import_module("monarch_ft.recipes.mttr_bench")  # registers the bench's schema
    # A multirun: every value of every sweep is checked before the first job starts.
    code, err = _check("mttr_bench", "-m", "bench.repeats=1", "ft.recovery=live,full_restart", "ft.max_restarts=1,x", capsys=capsys)
    _assert_one_error_line(code, err, "ft.max_restarts=x: Value 'x'")


@pytest.mark.parametrize("recipe", ["pretrain", "mttr_bench"])
def test_recipes_refuse_before_even_the_run_directory_exists(tmp_path, recipe):
    from monarch_ft.testing.jobs import REPO

    argv = [str(REPO / "recipes" / f"{recipe}.py"), "launcher.options.nope=1", f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    res = subprocess.run([sys.executable, *argv, *(["-m"] if recipe == "mttr_bench" else [])], cwd=REPO, capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    _assert_one_error_line(res.returncode, out, "launcher.options.nope=1: no such key")
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_lighthouse_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out = _run(tmp_path, f"ft.lighthouse_port={port}")
    assert code == 2, out
    assert f"ft.lighthouse_port={port} is already in use" in out and "pick another port, or 0" in out


def test_validate_accepts_defaults():
    from monarch_ft.config.job import JobConfig, validate
    from monarch_ft.controller.preflight import preflight

    validate(JobConfig())
    preflight(JobConfig())


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("model.flavor=nonsense", "model.flavor='nonsense' is not a llama3 flavor: choose one of 405B, 70B, 8B"),
        ("model.name=gpt5", "model.name='gpt5' is not a TorchTitan model with flavors: choose one of"),
        ("launcher=slurm launcher.options.poll_interval_s=0", "launcher.options.poll_interval_s=0.0: must be > 0"),
        ("launcher=monarch launcher.options.allocator=yarn", "launcher.options.allocator='yarn': choose one of local, slurm"),
        ("launcher.name=slurm", "launcher.name=slurm with launcher=local's options: select the launcher with launcher=slurm"),
    ],
)
def test_wrong_model_or_launcher_option_fails_before_launch(tmp_path, overrides, expected):
    """Checked on the controller before anything starts: one line, no rank, no Lighthouse."""
    assert expected in config_refusal(tmp_path, overrides)


def test_wrong_flavor_refused_by_the_drill_recipe(tmp_path):
    from monarch_ft.testing.jobs import assert_drill_refused

    assert_drill_refused(tmp_path, ["model.flavor=nonsense", "chaos.faults=[{kind: process_kill, at_step: 5}]"], "is not a llama3 flavor")


def test_a_config_dir_of_the_users_own_is_on_the_search_path(tmp_path, capsys):
    """``--config-dir``: the user's directory is searched after the package's configs (Hydra's rule), and
    the check composes with it; a directory that does not exist is one line."""
    from monarch_ft.cli.hydra_entry import check_command_line

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("defaults:\n  - schema\nname: llama3\nflavor: debugmodel\ndim: 32\nn_layers: 1\nn_heads: 2\n")
    check_command_line("pretrain", ["--config-dir", str(tmp_path), "model=mine"])  # composes: returns
    code, err = _check("pretrain", "--config-dir", str(tmp_path), "model=mine", "model.nope=1", capsys=capsys)
    _assert_one_error_line(code, err, "model.nope=1: no such key (Key 'nope' not in 'ModelConfig')")
    code, err = _check("pretrain", "--config-dir", str(tmp_path / "absent"), "model=mine", capsys=capsys)
    _assert_one_error_line(code, err, f"--config-dir {tmp_path / 'absent'}: no such directory")


def test_heartbeats_scale_with_the_job_unless_given():
    """0 (the default): 50/200 ms up to 100 replicas, then half a millisecond per replica
    (standbys heartbeat too); a given interval gets a timeout of at least 4 of it."""
    from monarch_ft.config.ft import FTConfig, heartbeat_for

    assert heartbeat_for(2) == heartbeat_for(100) == (50, 200)
    assert heartbeat_for(1024) == (512, 2048)
    assert (FTConfig().heartbeat_interval_ms, FTConfig().heartbeat_timeout_ms) == (50, 200)
    big = FTConfig(replica_groups=1000, standby_groups=24)
    assert (big.heartbeat_interval_ms, big.heartbeat_timeout_ms) == (512, 2048)
    assert FTConfig(heartbeat_interval_ms=100).heartbeat_timeout_ms == 400
    assert FTConfig(replica_groups=1024, heartbeat_timeout_ms=5000).heartbeat_interval_ms == 512
    # A value the rule worked out is no user's setting (so ft.lighthouse_addr does not refuse it).
    from monarch_ft.config.unused import changed

    assert not changed(big, "heartbeat_timeout_ms") and not changed(big, "heartbeat_interval_ms")
    assert changed(FTConfig(heartbeat_timeout_ms=5000), "heartbeat_timeout_ms")
    # Resized after construction (as a program does): the worked-out values follow the new size
    # at check(), a given one stays.
    grown = FTConfig(lighthouse_addr="127.0.0.1:1")
    grown.replica_groups = grown.min_replica_size = 1024
    grown.check()
    assert (grown.heartbeat_interval_ms, grown.heartbeat_timeout_ms) == (512, 2048)
    given = FTConfig(heartbeat_interval_ms=60)
    given.replica_groups = 1024
    given.check()
    assert (given.heartbeat_interval_ms, given.heartbeat_timeout_ms) == (60, 2048)
