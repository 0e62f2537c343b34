"""Where a measurement came from: the commit its results page names (docs/results/README.md)."""

from __future__ import annotations

import subprocess


def git_commit(repo: str) -> str:
    """The short hash of ``repo``'s HEAD, or "" outside a git checkout (an installed package).

    Args:
        repo: a folder inside the checkout.
    """
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
