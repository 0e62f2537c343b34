"""Fixtures shared by both tiers (tests/unit, tests/jobs); the helpers they use are
:mod:`monarch_ft.testing.jobs`. Every test under tests/jobs is marked slow, none under
tests/unit is: the fast tier is ``tests/unit`` (``-m "not slow"``)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from monarch_ft.controller.takeover import VERIFY_STATE_ENV
from monarch_ft.records.events import STRICT_EVENTS_ENV
from monarch_ft.testing.jobs import job_processes, lighthouse_pids

TESTS = Path(__file__).resolve().parent
# An event kind that is not an EventKind member raises where it is written, in this process and
# in every process a job test starts (they inherit it): tests/unit/test_event_kinds.py.
os.environ[STRICT_EVENTS_ENV] = "1"
# Every save of the takeover state checks what it kept incrementally against the whole snapshot
# (a change the tick did not tell it of fails the test), here and in every controller a job
# test starts: tests/unit/test_takeover_state.py.
os.environ[VERIFY_STATE_ENV] = "1"


def pytest_collection_modifyitems(config, items):
    """A test's tier is its folder: a slow test outside tests/jobs, or one inside it not marked
    slow, is a misplaced test (the fast tier would run a job, or the job tier miss one)."""
    for item in items:
        tier = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        slow = item.get_closest_marker("slow") is not None
        if (tier == "jobs") != slow:
            raise pytest.UsageError(f"{item.nodeid}: {'marked slow outside tests/jobs' if slow else 'in tests/jobs without the slow mark'}")
    # The job tier runs on two workers (pytest -n 2, --dist load: the README's command), which
    # take the tests in this order, one each in turn: the longest (marked long, by their minutes
    # beside another job test) go first, so that no worker is left at the end with a
    # three-minute test while the other is idle.
    items.sort(key=lambda item: -_long_minutes(item))


def _long_minutes(item) -> float:
    """A test's ``long(minutes)`` mark (1 when not given), 0 for a test not marked long."""
    mark = item.get_closest_marker("long")
    return 0 if mark is None else (mark.args[0] if mark.args else 1)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory; after the test, nothing of that job may still be running."""
    before = lighthouse_pids(tmp_path)
    d = tmp_path / "run"
    yield d
    left = [(p.pid, (p.info.get("cmdline") or [])[:4]) for p in job_processes(d)]
    for pid, _ in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    stray_lighthouses = lighthouse_pids(tmp_path) - before
    assert not left, f"processes left behind: {left}"
    assert not stray_lighthouses, f"lighthouse processes left behind: {stray_lighthouses}"
