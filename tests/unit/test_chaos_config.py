"""Drill configs (chaos.config, chaos.schedule): an impossible drill is refused before launch,
and a schedule is a function of its seed. The drills themselves run in tests/jobs/test_chaos_drill.py."""

from __future__ import annotations

import pytest

from monarch_ft.testing.jobs import assert_drill_refused


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["chaos.faults=[{kind: process_kill, at_step: 5, target: 7}]"], "no such group"),
        (["chaos.schedule=poisson", "chaos.rate_per_min=-1", "chaos.count=3"], "chaos.rate_per_min=-1.0: must be > 0"),
        (["chaos.schedule=poisson", "chaos.count=12", "ft.max_restarts=2"], "raise ft.max_restarts"),
        (["chaos.faults=[{kind: meteor, at_step: 5}]"], "kind='meteor'"),
        (["chaos.faults=[{kind: process_kill, at_step: 5, delay_ms: 50}]"], "delay_ms=50: process_kill faults have no delay_ms (only slow_link do): drop it"),
        ([], "the drill has no faults"),
    ],
)
def test_impossible_drills_fail_before_launch(tmp_path, overrides, expected):
    assert_drill_refused(tmp_path, overrides, expected)


def test_same_seed_same_schedule():
    from chaos.config import ChaosConfig
    from chaos.schedule import build_faults

    a = build_faults(ChaosConfig(schedule="poisson", count=5, seed=3, kinds=["hang", "node"]))
    b = build_faults(ChaosConfig(schedule="poisson", count=5, seed=3, kinds=["hang", "node"]))
    c = build_faults(ChaosConfig(schedule="poisson", count=5, seed=4, kinds=["hang", "node"]))
    assert [(f.kind, f.at_s) for f in a] == [(f.kind, f.at_s) for f in b] != [(f.kind, f.at_s) for f in c]
    assert all(x.at_s < y.at_s for x, y in zip(a, a[1:]))
