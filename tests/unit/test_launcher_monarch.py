"""launcher=monarch without a mesh: its options, and Monarch's failure reports read as exit codes.
Real proc meshes and actors are in tests/jobs/test_launcher_monarch_jobs.py."""

from __future__ import annotations

import monarch.actor  # noqa: E402,F401  (a hard dependency: a broken install fails here, it is not skipped)
import pytest

from monarch_ft.config.launcher import LauncherConfig  # noqa: E402
from monarch_ft.launcher import build_launcher  # noqa: E402


def test_unknown_options_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="bogus"):
        build_launcher(LauncherConfig(name="monarch", options={"bogus": 1}), str(tmp_path))
    with pytest.raises(ValueError, match="allocator"):
        build_launcher(LauncherConfig(name="monarch", options={"allocator": "yarn"}), str(tmp_path))
    with pytest.raises(ValueError, match="nodez"):
        build_launcher(LauncherConfig(name="monarch", options={"slurm": {"nodez": 2}}), str(tmp_path))


def test_monarch_reports_map_to_exit_codes():
    from monarch_ft.launcher.monarch import exit_code_from_report

    # Reports as Monarch 0.7.0 words them (seen in this launcher's runs); the proc is the wrapper sh.
    assert (
        exit_code_from_report(
            "The actor <root>.<m.S w{'procs': 1/2}> and all its descendants have failed:\n  the process this actor was running on failed: Killed(sig=9)"
        )
        == -9
    )
    assert exit_code_from_report("the process this actor was running on exited with non-zero code 3") == 3
    assert exit_code_from_report("the process this actor was running on exited with non-zero code 139") == -11
    assert exit_code_from_report("cleanup error: deadline has elapsed") is None
