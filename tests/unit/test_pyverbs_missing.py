"""An install without root or apt-get has no pyverbs: RDMA discovery then says so once per
process, in one line with the fix, and the transport goes on over TCP (never an import error)."""

from __future__ import annotations

import logging
import sys

from monarch_ft.transport import rdma_discovery


def test_missing_pyverbs_is_one_warning_line_with_the_fix(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)  # makes the import fail, as without the package
    monkeypatch.setattr(rdma_discovery, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=rdma_discovery.__name__):
        first, second = rdma_discovery.discover(), rdma_discovery.discover()
    assert not first.available and not second.available
    assert first.reason.startswith("pyverbs not importable"), first.reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # the interface choice and the transport both ask: one line
    line = warnings[0]
    assert "\n" not in line and "RDMA discovery unavailable" in line and "apt-get install python3-pyverbs" in line, line
