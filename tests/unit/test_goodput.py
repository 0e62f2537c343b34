"""The goodput arithmetic (monarch_ft.records.goodput) on recorded step records and on small hand-made ones.

tests/unit/fixtures/goodput/process_kill_2x1.jsonl: steps 170-190 of a real drill (2 groups x 1 rank, the
tiny model) in which group 1 was SIGKILLed after step 179 and its standby, promoted, committed step 180
while healing (its batch not in the update: ``participating_groups`` [0]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monarch_ft.records.goodput import goodput, goodput_ratio, group_commits

FIXTURE = Path(__file__).parent / "fixtures" / "goodput" / "process_kill_2x1.jsonl"
FAULT_AT = 1796346303.4335356  # the fault_injected event's time in that drill


def _records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_recorded_drill_counts_only_the_batches_that_went_into_an_update():
    recs = _records()
    assert len(recs) == 42  # steps 170-190, both groups
    commits = group_commits(recs)
    # The healing group's step 180 is committed but not its batch: the one record left out.
    assert len(commits) == 41
    assert not [m for m in commits if m["group"] == 1 and m["step"] == 180]
    times = sorted(m["time"] for m in recs)
    whole = goodput(recs, groups=2)
    # The first commit is the clock's origin, not counted.
    assert whole.group_steps == 40 and whole.start == times[0] and whole.end == times[-1]
    assert whole.rate == pytest.approx(40 / (times[-1] - times[0]))
    before = goodput(recs, groups=2, end=FAULT_AT)
    # Steps 170-179 of both groups precede the fault: 20 commits, the first one the origin.
    assert before.group_steps == 19 and before.end == FAULT_AT
    assert before.rate == pytest.approx(19 / (FAULT_AT - times[0]))
    # The fault cost the survivors ~0.7 s of steps: goodput below the fault-free rate.
    ratio = goodput_ratio(whole.rate, before.rate)
    assert 0.3 < ratio < 0.9, ratio
    # ETTR: the committed steps' own seconds over 2 groups x the window.
    seconds = sum(m["step_time_s"] for m in commits[1:])
    assert whole.ettr == pytest.approx(seconds / (2 * (times[-1] - times[0])))
    assert 0 < whole.ettr < 1


def _step(group: int, t: float, *, rank: int = 0, committed: bool = True, groups=(0, 1), step_time_s: float = 1.0) -> dict:
    return {"group": group, "rank": rank, "time": t, "committed": committed, "participating_groups": list(groups), "step_time_s": step_time_s}


def test_fixed_window_and_ettr_by_hand():
    recs = [_step(0, float(t)) for t in range(0, 11)]  # group 0: t = 0..10, one 1 s step each
    recs += [_step(1, float(t)) for t in (2, 4, 6, 8, 10)]  # group 1: half the steps
    recs += [_step(1, 3.0, rank=1), _step(1, 5.0, committed=False), _step(1, 7.0, groups=(0,))]  # none of these counts
    g = goodput(recs, groups=2, start=0.0, end=10.0)
    # (0, 10]: group 0's ten steps after the origin, group 1's five.
    assert (g.group_steps, g.seconds, g.rate) == (15, 10.0, 1.5)
    assert g.ettr == pytest.approx(15 / 20)
    # A window with no commit in it has rate 0, not None: the job made no progress.
    assert goodput(recs, groups=2, start=20.0, end=30.0).rate == 0.0


def test_no_window_no_figure():
    assert goodput([], groups=2) is None
    assert goodput([_step(0, 1.0)], groups=2) is None  # one commit: an origin, no window
    assert goodput([_step(0, 1.0)], groups=2, start=5.0, end=5.0) is None
    assert goodput_ratio(None, 2.0) is None and goodput_ratio(1.0, None) is None and goodput_ratio(1.0, 0.0) is None
    assert goodput_ratio(1.0, 2.0) == 0.5


def test_the_drill_uses_this_definition():
    import chaos.drill
    import monarch_ft.records.goodput as definition

    assert chaos.drill.goodput is definition.goodput and chaos.drill.goodput_ratio is definition.goodput_ratio
    assert not hasattr(chaos.drill, "samples_per_s")


def test_bench_faults_are_seeded_poisson_arrivals_from_the_mix():
    from chaos.goodput import TAIL_S, faults_override, poisson_faults

    KINDS = _bench_recipe().GoodputConfig().kinds

    assert poisson_faults(0, 90, seed=0, kinds=KINDS) == []
    faults = poisson_faults(4, 600, seed=1, kinds=KINDS)
    assert faults == poisson_faults(4, 600, seed=1, kinds=KINDS) and faults != poisson_faults(4, 600, seed=2, kinds=KINDS)
    times = [f["at_s"] for f in faults]
    assert times == sorted(times) and times[-1] < 600 - TAIL_S
    # About rate x seconds arrivals (Poisson, mean 39 over 590 s; far tails excluded).
    assert 20 <= len(faults) <= 60, len(faults)
    assert {f["kind"] + (":" + f["mode"] if "mode" in f else "") for f in faults} <= set(KINDS)
    assert not any(f["wait_standby"] for f in faults)  # a rate does not wait for a standby to be rebuilt
    assert faults_override([{"kind": "hang", "mode": "gil", "at_s": 1.5}]) == "chaos.faults=[{kind: hang, mode: gil, at_s: 1.5}]"


def test_bench_cells_use_the_same_goodput_and_the_closing_line():
    import chaos.goodput as bench
    from chaos.goodput import Cell, cell_figures, closing_line

    assert bench.goodput is goodput and bench.goodput_ratio is goodput_ratio
    recs = _records()
    start = min(m["time"] for m in recs)
    cell = cell_figures("live_standby", 2.0, recs, 2, start, 1.0, faults=1, injected=1, fault_free=10.0)
    inside = [m for m in group_commits(recs) if start < m["time"] <= start + 1.0]
    assert cell.rate == pytest.approx(len(inside) / 1.0) and cell.ratio == pytest.approx(cell.rate / 10.0)
    full = Cell("full_restart", 2.0, 2, 2, 1.0, 0.4567, 0.3)
    assert closing_line([cell, full]) == f"goodput_standby_at_2pm={cell.ratio:.3f} goodput_full_restart_at_2pm=0.457"
    assert closing_line([full]) == "goodput_standby_at_2pm=n/a goodput_full_restart_at_2pm=0.457"


def test_each_rates_cells_run_between_two_fault_free_references_and_divide_by_their_mean():
    from chaos.goodput import REFERENCE_ARM, plan_cells, reference_rate

    arms = ["live_standby", "live", "full_restart"]
    plan = plan_cells([4, 0, 2, 1, 2], arms)
    shown = [("ref" if p.reference else f"{p.arm}@{p.rate_per_min:g}") for p in plan]
    # Rate 0 has one cell (the idle standby's cost) and runs with rate 1; each later rate has a block of its own.
    assert shown == [
        "ref", "live_standby@0", "live_standby@1", "live@1", "full_restart@1",
        "ref", "live_standby@2", "live@2", "full_restart@2",
        "ref", "live_standby@4", "live@4", "full_restart@4", "ref",
    ]  # fmt: skip
    assert all(p.arm == REFERENCE_ARM and p.rate_per_min == 0 for p in plan if p.reference)
    for p in plan:
        if not p.reference:
            assert plan[p.before].reference and plan[p.after].reference and p.before < plan.index(p) < p.after
            assert not any(q.reference for q in plan[p.before + 1 : p.after])
    cell = plan[6]  # live_standby@2: between the references at 5 and 9
    assert reference_rate(cell, {0: 1.0}) is None
    assert reference_rate(cell, {0: 1.0, 5: 6.0}) == 6.0
    assert reference_rate(cell, {0: 1.0, 5: 6.0, 9: 8.0}) == 7.0
    assert [p.reference for p in plan_cells([2], arms)] == [True, False, False, False, True]


def _bench_recipe():
    import importlib.util

    return importlib.import_module("monarch_ft.recipes.goodput_bench")


def test_bench_config_checks_itself_and_refuses_keys_its_cells_set():
    from monarch_ft.records.errors import ConfigError

    recipe = _bench_recipe()
    recipe.GoodputConfig().check()
    for bad, says in (({"cell_s": 5.0}, "goodput.cell_s=5"), ({"arms": ["nope"]}, "goodput.arms"), ({"rates": [-1.0]}, "goodput.rates")):
        with pytest.raises(ConfigError, match=says):
            recipe.GoodputConfig(**bad).check()
    assert recipe.job_overrides(["goodput.cell_s=30", "ft.timeout_s=5", "hydra.run.dir=x"]) == ["ft.timeout_s=5"]
    for key in ("ft.recovery=live", "ft.standby_groups=0", "chaos.seed=1", "training.steps=10"):
        with pytest.raises(ConfigError, match="has no effect in the goodput bench"):
            recipe.job_overrides([key])
