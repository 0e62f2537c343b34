"""scripts/gpu_check.sh: its dry run on CPU for real (every check's job runs), its refusals,
and the GPU assignment the CUDA branch relies on."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import REPO

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


@pytest.mark.slow
def test_cpu_dry_run_runs_every_check(tmp_path):
    logs = tmp_path / "logs"
    res = _script("--cpu", str(logs), timeout=420)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    lines = out.splitlines()
    checks = {int(m.group(1)): (m.group(2), m.group(3)) for m in (re.match(r"check (\d) (\w+): (.*)", line) for line in lines) if m}
    assert sorted(checks) == [1, 2, 3, 4, 5, 6], out
    for n in (1, 2, 3, 4):
        assert checks[n][1].startswith("ok ("), (n, checks[n])
    assert "torchft ProcessGroupGloo configured" in checks[1][1]
    assert re.search(r"50 steps on cpu; .*loss [\d.]+ -> [\d.]+", checks[2][1]), checks[2]
    assert "healed from group 0" in checks[3][1] and "weights bit-identical" in checks[3][1], checks[3]
    assert "abort through gloo: step discarded, no restart" in checks[4][1] and "group 1 replaced" in checks[4][1], checks[4]
    assert checks[5][1].startswith("ok (") and "replaced by a standby" in checks[5][1], checks[5]
    # The overhead benchmark's smoke size (the suite's only run of it): its table and closing line.
    assert re.match(r"ok \(overhead_hsdp=[\d.]+ .*overhead_diloco=[\d.]+ .*loss_ratio_diloco=[\d.]+", checks[6][1]), checks[6]
    table = (logs / "6_ft_overhead.console.log").read_text()
    for label in ("no-FT", "hsdp", "diloco"):  # localsgd is left to the GPU run (gpu_check.sh)
        assert f"| {label}" in table, table[-2000:]
    assert "| localsgd" not in table
    assert lines[-1] == "gpu_checks passed=6 failed=0", out
    # The logs stay: each job's run directory and console, and this output.
    assert (logs / "gpu_check.txt").read_text() == out
    for name in ("2_train", "3_process_kill", "4_collective", "5_standby"):
        assert (logs / f"{name}.console.log").stat().st_size > 0, name
    assert (logs / "3_process_kill" / "drill.json").exists() and (logs / "2_train" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_failed_check_is_counted_and_named(tmp_path):
    """The verdict on a run that is not there: FAIL with the reason, exit 1 (what the shell counts)."""
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "kill", str(tmp_path / "nothing"), "--device", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stdout.startswith("FAIL: no drill.json in "), res.stdout + res.stderr


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
