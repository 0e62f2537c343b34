"""A sweep's jobs all run and its exit code says whether any failed (monarch_ft.cli.sweep), on
Hydra's real multirun with a task that only exits (no job is started)."""

from __future__ import annotations

import json
import sys

import pytest

from monarch_ft.cli.hydra_entry import hydra_main
from monarch_ft.cli.sweep import SweepJob, sweep_exit_code, sweep_table


def _sweep(monkeypatch, tmp_path, codes: dict[float, object]) -> tuple[int, list[float]]:
    ran: list[float] = []

    def task(cfg):
        ran.append(cfg.training.lr)
        code = codes[cfg.training.lr]
        if isinstance(code, BaseException):
            raise code
        sys.exit(code)

    lrs = ",".join(str(lr) for lr in codes)
    monkeypatch.setattr(
        sys, "argv", ["pretrain.py", "-m", f"training.lr={lrs}", f"hydra.sweep.dir={tmp_path}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    )
    with pytest.raises(SystemExit) as e:
        hydra_main("pretrain")(task)()
    return e.value.code, ran


def test_every_job_runs_and_a_failed_one_makes_the_sweep_fail(monkeypatch, tmp_path, capsys):
    code, ran = _sweep(monkeypatch, tmp_path, {0.1: 1, 0.2: 0, 0.3: RuntimeError("a bug in one job")})
    assert ran == [0.1, 0.2, 0.3] and code == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[monarch_ft sweep]")]
    assert "3 jobs, 2 failed" in lines[0]
    assert [line.split()[2:5] for line in lines[2:]] == [["0", "training.lr=0.1", "failed"], ["1", "training.lr=0.2", "ok"], ["2", "training.lr=0.3", "failed"]]


def test_a_sweep_of_jobs_that_all_pass_exits_0(monkeypatch, tmp_path):
    assert _sweep(monkeypatch, tmp_path, {0.1: 0, 0.2: None}) == (0, [0.1, 0.2])


def test_an_interrupted_job_ends_the_sweep_with_its_code(monkeypatch, tmp_path, capsys):
    code, ran = _sweep(monkeypatch, tmp_path, {0.1: 130, 0.2: 0})
    assert (code, ran) == (130, [0.1])
    assert "1 job, 1 failed" in capsys.readouterr().out


def test_exit_code_and_table_from_the_jobs_summaries(tmp_path):
    done = tmp_path / "0"
    done.mkdir()
    (done / "summary.json").write_text(json.dumps({"status": "completed", "groups": {"0": {"last_loss": 2.0}, "1": {"last_loss": 3.0}}}))
    jobs = [SweepJob(0, ["a=1", "lr=1"], str(done), 0), SweepJob(1, ["a=1", "lr=2"], str(tmp_path / "1"), 2)]
    assert sweep_table(jobs)[1:] == ["0    lr=1       completed              2.5000", "1    lr=2       config error (exit 2)  -"]
    assert sweep_exit_code(jobs) == 2
    assert sweep_exit_code(jobs + [SweepJob(2, [], "", 1)]) == 1
    assert sweep_exit_code([SweepJob(0, [], "", 0)]) == 0
