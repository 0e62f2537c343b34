"""The package as a user installs it: a wheel built from the repository, installed into a fresh venv,
its ``monarch-ft`` command run from a directory that is not the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from monarch_ft.testing.jobs import REPO, processes_matching

pytestmark = pytest.mark.slow

# What the fresh venv must not see of the project venv: this project itself (its editable install,
# its packages), so that only the wheel's copy can be imported.
OWN = ("monarch_ft", "__editable__", "chaos")


def _venv_on_project_packages(venv: Path, base: Path) -> Path:
    """A fresh venv whose site-packages reads the project venv's installed packages (every one but
    this project's own, through a folder of links processed as a site directory), so pip resolves
    the wheel's dependencies against the very releases CI installed, offline and without copying
    torch again; returns its python."""
    site = Path(sysconfig.get_paths()["purelib"])
    base.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(OWN) and entry.name != "__pycache__":
            (base / entry.name).symlink_to(entry)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    Path(own_site.stdout.strip(), "project_packages.pth").write_text(f"import site; site.addsitedir({str(base)!r})\n")
    return python


def test_the_built_wheel_installs_offline_and_trains_from_any_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(dist), str(REPO)], check=True, capture_output=True, env=env)
    (wheel,) = dist.glob("monarch_ft-*.whl")
    python = _venv_on_project_packages(tmp_path / "venv", tmp_path / "base")
    # --no-index: no package index at all; every dependency must already be there (or the install fails).
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", str(wheel)], capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    command = tmp_path / "venv" / "bin" / "monarch-ft"
    assert command.is_file(), "the wheel gives no monarch-ft command"
    imported = "import monarch_ft, chaos; print(monarch_ft.__file__, chaos.__file__)"
    where = subprocess.run([python, "-c", imported], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert all(p.startswith(str(tmp_path / "venv")) for p in where.stdout.split()), where.stdout + where.stderr

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    job = subprocess.run([command, "pretrain", "training.steps=5"], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    # Its run directory under the working directory (the configs' default), the job complete.
    (run,) = (cwd / "outputs" / "pretrain").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["job_step"] == 5 and summary["weights_consistent"] is True, summary
    assert not processes_matching(str(tmp_path)), "the job left processes running"
