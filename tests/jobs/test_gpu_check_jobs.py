"""scripts/gpu_check.sh: its dry run on CPU for real (the checks no other test covers), and a failed check named."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"


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
@pytest.mark.long
def test_cpu_dry_run_of_the_checks_no_other_test_covers(tmp_path):
    """The script for real on CPU, with the checks nothing else here runs: the environment
    (torchft's process group configured, an allreduce, an abort) and the overhead benchmark's
    smoke size (the suite's only run of it). Checks 2-5 train and drill as the job tests do
    (tests/jobs/test_pretrain.py, test_chaos_drill.py, test_standby_jobs.py); their verdicts
    on recorded runs of theirs are in tests/unit/test_gpu_check.py."""
    logs = tmp_path / "logs"
    res = _script("--cpu", "--only", "1,6", str(logs), timeout=420)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    lines = out.splitlines()
    checks = {int(m.group(1)): (m.group(2), m.group(3)) for m in (re.match(r"check (\d) (\w+): (.*)", line) for line in lines) if m}
    assert sorted(checks) == [1, 2, 3, 4, 5, 6], out
    assert checks[1][1].startswith("ok (") and "torchft ProcessGroupGloo configured" in checks[1][1], checks[1]
    # The others are listed, skipped, and nothing of them ran.
    names = {2: "train", 3: "process_kill", 4: "collective", 5: "standby"}
    for n, name in names.items():
        assert checks[n] == (name, "skip: not selected (--only 1,6)"), checks[n]
        assert not list(logs.glob(f"{n}_*")), n
    # The overhead benchmark's smoke size: its table and closing line.
    assert re.match(r"ok \(overhead_hsdp=[\d.]+ .*overhead_diloco=[\d.]+ .*loss_ratio_diloco=[\d.]+", checks[6][1]), checks[6]
    table = (logs / "6_ft_overhead.console.log").read_text()
    for label in ("no-FT", "hsdp", "diloco"):  # localsgd is left to the GPU run (gpu_check.sh)
        assert f"| {label}" in table, table[-2000:]
    assert "| localsgd" not in table
    assert lines[-1] == "gpu_checks passed=2 failed=0", out
    # The output stays with the logs.
    assert (logs / "gpu_check.txt").read_text() == out


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
