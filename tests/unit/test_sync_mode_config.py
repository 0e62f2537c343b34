"""ft.mode settings that cannot run (localsgd, diloco, streaming DiLoCo) are refused in one line.
The modes in real jobs are in tests/jobs/test_sync_modes_jobs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from monarch_ft.testing.jobs import REPO


@pytest.mark.parametrize(
    "override, expected",
    [
        ("ft.mode=sync", "ft.mode='sync': choose one of hsdp, localsgd, diloco"),
        ("ft.sync_every=7", "training.steps=30: ft.mode=diloco syncs every 7 steps"),
        ("ft.fragments=4", "ft.fragments=4: must be >= 1 and divide ft.sync_every=10"),
    ],
)
def test_bad_mode_settings_are_one_line(tmp_path, override, expected):
    args = [sys.executable, str(REPO / "recipes" / "pretrain.py"), "ft.mode=diloco", "ft.sync_every=10", override, f"hydra.run.dir={tmp_path / 'r'}"]
    if override.startswith("ft.mode="):
        args.remove("ft.mode=diloco")
    res = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and expected in errors[0], res.stderr
