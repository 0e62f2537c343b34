"""scripts/gpu_check.sh: its refusals, the GPU assignment the CUDA branch relies on, and the
verdicts of scripts/gpu_check.py on recorded runs. Its dry run on CPU (the checks no other job
test covers) is in tests/jobs/test_gpu_check_jobs.py."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
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
        (["--cpu", "x", "--only"], "gpu_check: --only needs check numbers"),
        (["--cpu", "--only", "7", "x"], "gpu_check: --only 7: give check numbers 1-6"),
        (["--cpu", "--only=1,,6", "x"], "gpu_check: --only 1,,6: give check numbers 1-6"),
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


# ---------------------------------------------------------------- the verdicts on recorded runs
# tests/unit/fixtures/gpu_check/N_name: what checks 2-5 of a --cpu dry run left (the events the
# verdicts read, drill.json; for 2_train its metrics and summary, cut to the fields read). The job
# tier runs the script for real with the checks no other job test covers (--only 1,6): these
# keep the verdicts of the others checked against what a real run writes.
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "gpu_check"


def _verdict(capsys, *argv: str) -> tuple[int, str]:
    """gpu_check.py's one line and exit code, run in this process."""
    spec = importlib.util.spec_from_file_location("_gpu_check_verdicts", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main(list(argv))
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    return code, out.strip()


def _copy(tmp_path, name: str):
    return shutil.copytree(FIXTURES / name, tmp_path / name)


def _rewrite_jsonl(path, change) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(x) + "\n" for x in change(lines)))


def test_verdicts_pass_the_runs_checks_2_to_5_recorded(capsys):
    code, line = _verdict(capsys, "train", str(FIXTURES / "2_train"), "--device", "cpu", "--steps", "50")
    assert code == 0 and re.match(r"ok \(50 steps on cpu; .*loss [\d.]+ -> [\d.]+\)$", line), line
    code, line = _verdict(capsys, "kill", str(FIXTURES / "3_process_kill"), "--device", "cpu", "--xgroup", "gloo")
    assert code == 0 and line.startswith("ok (") and "healed from group 0" in line and "weights bit-identical" in line, line
    code, line = _verdict(capsys, "collective", str(FIXTURES / "4_collective"), "--device", "cpu", "--xgroup", "gloo")
    assert code == 0 and "abort through gloo: step discarded, no restart" in line and "group 1 replaced" in line, line
    code, line = _verdict(capsys, "standby", str(FIXTURES / "5_standby"), "--device", "cpu", "--xgroup", "gloo")
    assert code == 0 and line.startswith("ok (") and "replaced by a standby" in line, line


def test_verdicts_fail_what_they_check(tmp_path, capsys):
    # The device and the cross-group backend every rank reported.
    assert _verdict(capsys, "kill", str(FIXTURES / "3_process_kill"), "--device", "cuda", "--xgroup", "nccl") == (
        1,
        "FAIL: ranks trained on ['cpu'], expected cuda",
    )
    assert _verdict(capsys, "kill", str(FIXTURES / "3_process_kill"), "--device", "cpu", "--xgroup", "nccl") == (
        1,
        "FAIL: cross-group backend ['gloo'], expected nccl",
    )
    # Training: as many committed steps as asked, and a falling loss.
    assert _verdict(capsys, "train", str(FIXTURES / "2_train"), "--steps", "60")[1] == "FAIL: 50 committed steps with a loss, expected 60"
    train = _copy(tmp_path, "2_train")
    _rewrite_jsonl(train / "metrics.jsonl", lambda ms: [{**m, "loss": 10.0 + m["step"] / 100} for m in ms])
    assert _verdict(capsys, "train", str(train))[1].startswith("FAIL: loss did not fall")
    # A kill: healed from a live peer, with the same weights.
    kill = _copy(tmp_path, "3_process_kill")
    drill = json.loads((kill / "drill.json").read_text())
    (kill / "drill.json").write_text(json.dumps({**drill, "faults": [{**drill["faults"][0], "recovered_from_group": 1}]}))
    assert _verdict(capsys, "kill", str(kill))[1] == "FAIL: the killed group did not heal from a live peer (recovered_from_group=1)"
    (kill / "drill.json").write_text(json.dumps({**drill, "weights_consistent": False}))
    assert _verdict(capsys, "kill", str(kill))[1].startswith("FAIL: summary.json weights_consistent is not true")
    # A collective abort is absorbed in place: a relaunch between the abort and the hang fails it.
    coll = _copy(tmp_path, "4_collective")
    abort, hang = json.loads((coll / "drill.json").read_text())["faults"]
    relaunch = {"time": (abort["injected_at"] + hang["injected_at"]) / 2, "event": "group_launched", "group": abort["target"], "attempt": 1}
    _rewrite_jsonl(coll / "events.jsonl", lambda es: es + [relaunch])
    assert _verdict(capsys, "collective", str(coll))[1] == f"FAIL: the abort restarted group {abort['target']}; it must be absorbed in place"
    # A standby check passes only where a standby took the group's place.
    sb = _copy(tmp_path, "5_standby")
    drill = json.loads((sb / "drill.json").read_text())
    cold = {k: ("warm_fork" if v == "standby" else v) for k, v in drill["faults"][0].items()}
    (sb / "drill.json").write_text(json.dumps({**drill, "faults": [cold]}))
    assert _verdict(capsys, "standby", str(sb))[1].startswith("FAIL: the killed group was not replaced by a standby")
