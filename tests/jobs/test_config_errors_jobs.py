"""Bad input through a recipe that starts the job's machinery: one clear line, exit 2, no hang."""

from __future__ import annotations

import glob
import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import PRETRAIN, REPO


def _run(tmp_path, *overrides, timeout=60):
    res = subprocess.run(
        [sys.executable, str(PRETRAIN), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return res.returncode, res.stdout + res.stderr


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia*")), reason="this machine may have a GPU")
@pytest.mark.slow
def test_cuda_refused_where_there_is_no_gpu(tmp_path):
    code, out = _run(tmp_path, "training.device=cuda")
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and "training.device=cuda: torch sees no CUDA device here" in errors[0], out
