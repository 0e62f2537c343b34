"""scripts/gpu_check.sh: its dry run on CPU for real (every check's job runs), and a failed check named."""

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
