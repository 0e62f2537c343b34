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
        ("ft.standby_groups=-1", "ft.standby_groups=-1: must be >= 0"),
        ("launcher=monarch ft.standby_groups=1", "warm standby groups are implemented for launcher=local and local_hosts only so far"),
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
        ("ft.no_such_key=1", "no_such_key"),
        ("ft.replica_groups=two", "replica_groups"),
        ("model=no_such_model", "no_such_model"),
    ],
)
def test_schema_errors_come_from_hydra(tmp_path, override, expected):
    code, out = _run(tmp_path, override)
    assert code != 0 and expected in out, out
    assert "Traceback" not in out


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
        ("+launcher.options.bogus=1", "launcher=local: unknown option(s) bogus: known are simulated_hosts"),
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
        ("launcher.options.bogus=1", "Key 'bogus' not in 'Options'"),
        ("launcher=slurm launcher.options.cpus_per_task=abc", "launcher.options.cpus_per_task"),
        ("launcher=monarch launcher.options.slurm.nodez=2", "Key 'nodez' not in 'SlurmJobOptions'"),
    ],
)
def test_unknown_or_mistyped_launcher_option_fails_in_hydra(tmp_path, overrides, expected):
    """Each launcher's options are a typed node of Hydra's launcher group: Hydra names the key."""
    code, out = _run(tmp_path, *overrides.split())
    assert code != 0 and expected in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "run").exists(), "Hydra refuses before the job starts"


def test_wrong_flavor_refused_by_the_drill_recipe(tmp_path):
    from conftest import assert_drill_refused

    assert_drill_refused(tmp_path, ["model.flavor=nonsense", "chaos.faults=[{kind: process_kill, at_step: 5}]"], "is not a llama3 flavor")
