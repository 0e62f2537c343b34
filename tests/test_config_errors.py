"""Bad input fails at once with one clear line and a non-zero exit: never a hang."""

from __future__ import annotations

import glob
import socket
import subprocess
import sys

import pytest

from conftest import PRETRAIN, REPO


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
        ("ft.lighthouse_addr=http://127.0.0.1:9", "cannot reach the Lighthouse at http://127.0.0.1:9"),
        ("launcher.name=carrier_pigeon", "launcher='carrier_pigeon': choose one of"),
        ("training.device=tpu", "training.device='tpu': choose one of auto, cpu, cuda"),
        ("ft.cross_group_backend=mpi", "ft.cross_group_backend='mpi': choose one of auto, nccl, gloo"),
        ("training.device=cpu ft.cross_group_backend=nccl", "ft.cross_group_backend=nccl needs CUDA"),
    ],
)
def test_bad_values_fail_with_one_line(tmp_path, override, expected):
    code, out = _run(tmp_path, *override.split())
    _assert_one_error_line(code, out, expected)


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia*")), reason="this machine may have a GPU")
@pytest.mark.slow
def test_cuda_refused_where_there_is_no_gpu(tmp_path):
    code, out = _run(tmp_path, "training.device=cuda")
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and "training.device=cuda: torch sees no CUDA device here" in errors[0], out


@pytest.mark.parametrize(
    "override, expected",
    [
        ("ft.no_such_key=1", "ft.no_such_key=1: no such key (Key 'no_such_key' not in 'FTConfig'); ft has: replica_groups, ranks_per_group,"),
        ("ft.replica_groups=two", "ft.replica_groups=two: Value 'two' of type 'str' could not be converted to Integer"),
        ("model=no_such_model", "Could not find 'model/no_such_model' Available options in 'model': debugmodel, tiny"),
        ("ft.replica_groups=[1", "no viable alternative at input '[1'"),
        # "+" adds a key even to a schema: one the schema lacks is refused, not silently carried.
        ("+ft.nokey=3", "+ft.nokey=3: no such key (Key 'nokey' not in 'FTConfig'); ft has: replica_groups,"),
        ("+nokey=3", "+nokey=3: no such key (Key 'nokey' not in 'JobConfig'); the config has: model, training, data, ft,"),
    ],
)
def test_schema_errors_are_one_line_before_hydra_starts(tmp_path, override, expected):
    """What Hydra refuses to compose is one line and exit 2 too, before even the run directory exists."""
    code, out = _run(tmp_path, override)
    _assert_one_error_line(code, out, expected)
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert not (tmp_path / "run").exists()


def test_lighthouse_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out = _run(tmp_path, f"ft.lighthouse_port={port}")
    assert code == 2, out
    assert f"ft.lighthouse_port={port} is already in use" in out and "pick another port, or 0" in out


def test_validate_accepts_defaults():
    from monarch_ft.config import JobConfig, validate

    validate(JobConfig())


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("model.flavor=nonsense", "model.flavor='nonsense' is not a llama3 flavor: choose one of 405B, 70B, 8B"),
        ("model.name=gpt5", "model.name='gpt5' is not a TorchTitan model with flavors: choose one of"),
        ("launcher=slurm launcher.options.poll_interval_s=0", "launcher.options.poll_interval_s=0.0: must be > 0"),
        ("launcher=monarch launcher.options.allocator=yarn", "launcher.options.allocator='yarn': choose one of local, slurm"),
        ("+launcher.options.bogus=1", "+launcher.options.bogus=1: no such key (Key 'bogus' not in 'Options'); launcher.options has: simulated_hosts"),
        ("launcher.name=slurm", "launcher.name=slurm with launcher=local's options: select the launcher with launcher=slurm"),
    ],
)
def test_wrong_model_or_launcher_option_fails_before_launch(tmp_path, overrides, expected):
    """Checked on the controller before anything starts: one line, exit 2, no rank, no Lighthouse."""
    code, out = _run(tmp_path, *overrides.split())
    _assert_one_error_line(code, out, expected)
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "events.jsonl").exists() and not (tmp_path / "run" / "logs").exists(), "nothing may be launched"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("launcher.options.nope=1", "launcher.options.nope=1: no such key (Key 'nope' not in 'Options'); launcher.options has: simulated_hosts"),
        ("launcher=slurm launcher.options.cpus_per_task=abc", "launcher.options.cpus_per_task=abc: Value 'abc' of type 'str' could not be converted"),
        ("launcher=monarch launcher.options.slurm.nodez=2", "slurm.nodez=2: no such key (Key 'nodez' not in 'SlurmJobOptions'); launcher.options.slurm has:"),
        ("launcher=carrier_pigeon", "Could not find 'launcher/carrier_pigeon' Available options in 'launcher': local, local_hosts, monarch, slurm"),
    ],
)
def test_unknown_or_mistyped_launcher_option_is_one_line(tmp_path, overrides, expected):
    """Each launcher's options are a typed node of Hydra's launcher group; what does not fit it is
    refused like any config error: one line naming the key and what the section has, exit 2."""
    code, out = _run(tmp_path, *overrides.split())
    _assert_one_error_line(code, out, expected)
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert not (tmp_path / "run").exists(), "refused before the job starts"


def test_drill_and_bench_recipes_refuse_schema_errors_the_same_way(tmp_path):
    from conftest import DRILL, REPO

    bench = REPO / "recipes" / "mttr_bench.py"
    for argv, expected in [
        ([str(DRILL), "chaos.nope=1"], "chaos.nope=1: no such key"),
        # A multirun: every value of every sweep is checked before the first job starts.
        ([str(bench), "-m", "bench.kind=process_kill", "ft.recovery=live,full_restart", "ft.max_restarts=1,x"], "ft.max_restarts=x: Value 'x'"),
    ]:
        res = subprocess.run([sys.executable, *argv, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        _assert_one_error_line(res.returncode, res.stdout + res.stderr, expected)
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_wrong_flavor_refused_by_the_drill_recipe(tmp_path):
    from conftest import assert_drill_refused

    assert_drill_refused(tmp_path, ["model.flavor=nonsense", "chaos.faults=[{kind: process_kill, at_step: 5}]"], "is not a llama3 flavor")
