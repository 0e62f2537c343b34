"""scripts/gpu_check.sh: its refusals, and the GPU assignment the CUDA branch relies on.
Its dry run on CPU (every check's job runs) is in tests/jobs/test_gpu_check_jobs.py."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"

HAS_GPU_NODES = bool(glob.glob("/dev/nvidia*")) or shutil.which("nvidia-smi") is not None


def _script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the script in its own session; past ``timeout`` the whole session is stopped
    (SIGTERM: the supervisor stops its ranks; then SIGKILL) and the test fails."""
    env = dict(os.environ, PYTHON=sys.executable)
    argv = ["bash", str(SCRIPT), *args]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"gpu_check.sh {' '.join(args)} ran past {timeout}s: {out[-3000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.skipif(HAS_GPU_NODES, reason="this machine has a GPU")
def test_refuses_at_once_without_a_gpu(tmp_path):
    res = _script(str(tmp_path / "logs"), timeout=20)
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("gpu_check: no GPU here") and "--cpu" in res.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "gpu_check: no log folder given"),
        (["--cpu"], "gpu_check: no log folder given"),
        (["--cpu", "--fast", "x"], "gpu_check: unknown option --fast"),
        (["--cpu", "a", "b"], "gpu_check: one LOG_DIR only"),
        (["--cpu", "--cross-group"], "gpu_check: --cross-group needs a value"),
        (["--cpu", "--cross-group", "mpi", "x"], "gpu_check: --cross-group mpi: choose nccl or gloo"),
        (["--cpu", "--cross-group", "nccl", "x"], "gpu_check: --cross-group nccl needs a GPU"),
    ],
)
def test_bad_arguments_one_line(args, expected):
    res = _script(*args, timeout=20)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(expected) and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


def test_refuses_a_log_folder_in_use(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    res = _script("--cpu", str(tmp_path), timeout=20)
    assert res.returncode == 2 and "is not empty" in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


def test_gpu_assignment_spreads_groups_and_flags_sharing():
    from monarch_ft.common.devices import cuda_index, groups_share_a_gpu

    # 2 groups x 2 ranks on 4 GPUs: every rank its own GPU (rank % GPUs put both groups on 0-1).
    assert [cuda_index(g, r, 2, 4) for g in range(2) for r in range(2)] == [0, 1, 2, 3]
    assert not groups_share_a_gpu(2, 2, 4)
    # One GPU, two groups of one rank: the case gpu_check's checks 3-4 run on one H200.
    assert [cuda_index(g, 0, 1, 1) for g in range(2)] == [0, 0] and groups_share_a_gpu(2, 1, 1)
    assert groups_share_a_gpu(2, 2, 2) and not groups_share_a_gpu(1, 8, 8)
