"""Goodput, ETTR and the goodput bench's figures (monarch_ft.records.goodput, chaos.goodput) on recorded runs.

Fixtures (tests/unit/fixtures/goodput/, rank 0's step records and the events of real runs, 2 groups x 1 rank,
the tiny model):

- ``process_kill_2x1.jsonl``: steps 170-190 of a drill in which group 1 was SIGKILLed after step 179; its
  standby, promoted, committed step 180 while healing (its batch not in the update), and group 0 waited.
- ``full_restart_2x1/``: a drill under ``ft.recovery=full_restart``: group 1 SIGKILLed at step 26, every
  group resumed from the checkpoint of step 20 and trained steps 20-26 again (``job_rollback`` to 20).
- ``full_restart_overlap_2x1/``: 8 s of a goodput-bench cell under ``ft.recovery=full_restart`` with
  ``chaos.overlap``: a second kill of group 1 while every group restarted from the first.
- ``diloco_standby_2x1/``: a drill with ``ft.mode=diloco ft.sync_every=10`` and a standby: group 1
  SIGKILLed right after its sync at step 29; the standby healed into the sync at step 39.

Each of the first five tests is built to fail on the definition this one replaced (every committed
rank-0 record counted, the window from the first commit, ETTR a sum of step times, no provisioned
replicas, faults not recovered left out).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monarch_ft.records.goodput import goodput, goodput_ratio, lineage, median_step_s, rollbacks_of, windows
from monarch_ft.records.layout import read_jsonl
from monarch_ft.testing.fakes import FakeChaosJob

FIXTURES = Path(__file__).parent / "fixtures" / "goodput"
KILLED_AT = 1796346303.4335356  # process_kill_2x1: the fault_injected event's time


def _jsonl(path: Path) -> list[dict]:
    return read_jsonl(str(path))


def _run(name: str) -> tuple[list[dict], list[dict], dict]:
    d = FIXTURES / name
    return _jsonl(d / "metrics.jsonl"), _jsonl(d / "events.jsonl"), json.loads((d / "summary.json").read_text())


def _launch(events: list[dict]) -> float:
    return next(e["time"] for e in events if e["event"] == "job_started")


def _committed(metrics: list[dict]) -> list[dict]:
    """What the replaced definition counted: every committed rank-0 record of a participating group."""
    return [m for m in metrics if m["rank"] == 0 and m["committed"] and m["group"] in m["participating_groups"]]


# ---------------------------------------------------------------- the five the issue asks for
def test_a_rollbacks_redone_steps_count_once():
    metrics, events, _ = _run("full_restart_2x1")
    rollbacks = rollbacks_of(events)
    assert [(e["to_step"], e["reason"]) for e in rollbacks] == [(20, "full_restart")]
    final = max(m["step"] for m in metrics)
    assert final == 38
    lin = lineage(metrics, rollbacks)
    # The final history: steps 0-38 of both groups, each once; steps 20-26 were trained twice.
    assert set(lin.useful) == {(g, s) for g in (0, 1) for s in range(final + 1)}
    assert (lin.count, lin.rolled_back, lin.redone, lin.rollbacks) == (78, 14, 14, 1)
    # Trained: the 78, the 14 given up, and group 0's uncommitted step 27 as group 1 died.
    assert lin.trained == 93 and lin.wasted == 15
    # The records alone show it too (a group keeping step 20 a second time), without the event.
    assert lineage(metrics).useful.keys() == lin.useful.keys()
    # The replaced definition counted the 14 re-done group-steps twice.
    assert len(_committed(metrics)) == 92
    g = goodput(metrics, _launch(events), groups=2, rollbacks=rollbacks)
    assert g.useful == 78 and g.rolled_back == 14


def test_a_waiting_survivors_stall_is_not_counted_as_ettr():
    recs = _jsonl(FIXTURES / "process_kill_2x1.jsonl")
    start = min(m["time"] for m in recs)
    pace = median_step_s(recs, end=KILLED_AT)
    assert 0.02 < pace < 0.06
    # Group 0, the survivor, waited ~0.7 s for group 1's replacement before committing step 180.
    s179, s180 = (next(m for m in recs if m["group"] == 0 and m["step"] == s) for s in (179, 180))
    stall = s180["time"] - s179["time"]
    assert stall > 0.6
    # As torchft records a survivor that waits inside its quorum: the wait in the step's step_time_s.
    waited = [dict(m, step_time_s=m["step_time_s"] + stall) if m is s180 else m for m in recs]
    whole, before = goodput(waited, start, groups=2), goodput(waited, start, groups=2, end=KILLED_AT)
    ettr, ettr_before = whole.ettr(pace), before.ettr(pace)
    assert ettr == pytest.approx(whole.useful * pace / (2 * whole.seconds))
    assert ettr == goodput(recs, start, groups=2).ettr(pace), "a step's own time does not enter ETTR"
    # The stall is lost time: ETTR with the fault is below the fault-free stretch's.
    assert ettr < ettr_before - 0.1
    # The replaced definition (step times summed) counted the wait as training and read the fault's
    # window above the fault-free one, as the bench's live arms once read 0.55-0.56 against 0.546.
    summed = sum(m["step_time_s"] for m in _committed(waited) if start < m["time"] <= whole.end) / (2 * whole.seconds)
    summed_before = sum(m["step_time_s"] for m in _committed(waited) if start < m["time"] <= KILLED_AT) / (2 * before.seconds)
    assert summed > summed_before


def test_warm_up_is_charged():
    metrics, events, _ = _run("full_restart_2x1")
    launch, first = _launch(events), min(m["time"] for m in _committed(metrics))
    assert first - launch > 1.0  # imports, model build, the Lighthouse, the first step
    g = goodput(metrics, launch, groups=2, rollbacks=rollbacks_of(events))
    last = max(g2 for g2 in lineage(metrics).useful.values())
    assert g.launch == launch and g.end == last
    assert g.rate == pytest.approx(78 / (last - launch))
    # From the first commit (the replaced window) the same run reads about twice as fast.
    assert goodput(metrics, first, groups=2, rollbacks=rollbacks_of(events)).rate > 1.5 * g.rate


def test_a_standby_is_charged_per_provisioned_replica():
    from chaos.drill import drill_goodput
    from chaos.goodput import NOFT, CellFigures, summarize

    metrics, events, summary = _run("diloco_standby_2x1")
    assert summary["standby"]["standby_groups"] == 1

    class Cfg:  # the drill config's fields drill_goodput reads
        class ft:
            replica_groups, ranks_per_group = 2, 1

        class training:
            batch_size, seq_len = 2, 64

    figures = drill_goodput(Cfg, events, metrics, summary, first_fault=None)
    assert figures["provisioned_replicas"] == 3
    assert figures["goodput_per_provisioned_replica"] == pytest.approx(figures["goodput_group_steps_per_s"] / 3)
    assert figures["goodput_tokens_per_s"] == pytest.approx(figures["goodput_group_steps_per_s"] * 2 * 64)

    # The bench: the standby arm's rate per provisioned replica against plain training's per replica.
    def cell(arm, rate, rep, useful_rate, provisioned):
        return CellFigures(arm, rate, rep, rep, 0.0, 60.0, 50.0, 0, 0, 0, useful_rate, useful_rate / provisioned, None, provisioned, 0.02)

    cells = []
    for rep in range(3):
        cells += [cell(NOFT, 0.0, rep, 40.0, 2), cell("live_standby", 0.0, rep, 38.0, 3), cell("live_standby", 2.0, rep, 36.0 - rep, 3)]
    (faulted,) = [s for s in summarize(cells, groups=2) if s.arm == "live_standby" and s.rate_per_min == 2.0]
    assert faulted.vs_noft.value == pytest.approx(105 / 120)
    # A third replica held for a standby: two thirds of the per-group figure.
    assert faulted.per_provisioned.value == pytest.approx((105 / 120) * 2 / 3)
    assert faulted.goodput.value == pytest.approx(105 / 114)  # against its own fault-free cells
    assert faulted.per_provisioned.lo <= faulted.per_provisioned.value <= faulted.per_provisioned.hi


def test_a_fault_not_recovered_is_reported():
    from chaos.goodput import NOFT, CellFigures, Planned, cell_figures, fault_outcomes, summarize

    metrics, events, _ = _run("full_restart_2x1")
    drill = {
        "faults": [
            {"id": 0, "kind": "process_kill", "at_s": 0.9, "injected": True, "recovered": True, "mttr_s": 5.2},
            {
                "id": 1,
                "kind": "hang",
                "mode": "gil",
                "at_s": 6.0,
                "injected": True,
                "recovered": False,
                "mttr_s": None,
                "not_recovered": {"reason": "job_ended", "detail": "the job ended before the group was back in the quorum"},
            },
            {"id": 2, "kind": "process_kill", "at_s": 1e9, "injected": False},  # the bench's placeholder
        ]
    }
    outcomes = fault_outcomes(drill, never_s=1e9)
    assert [(f.kind, f.injected, f.recovered) for f in outcomes] == [("process_kill", True, True), ("hang:gil", True, False)]
    launch = _launch(events)
    cell = cell_figures(Planned("full_restart", 2.0, 0, 0), metrics, events, launch, launch + 15, launch + 13, 2, 2, 128, outcomes)
    assert (cell.injected, cell.not_recovered) == (2, 1)
    assert "job ended" in cell.faults[1].why
    ff = CellFigures("full_restart", 0.0, 0, 0, 0.0, 10.0, 8.0, 0, 0, 0, 10.0, 5.0, None, 2, 0.02)
    noft = CellFigures(NOFT, 0.0, 0, 0, 0.0, 10.0, 8.0, 0, 0, 0, 12.0, 6.0, None, 2, 0.02)
    (row,) = [s for s in summarize([noft, ff, cell], groups=2) if s.rate_per_min == 2.0]
    assert (row.scheduled, row.injected, row.recovered, row.not_recovered) == (2, 2, 1, 1)
    assert row.mttr_s == [5.2]
    # The eviction bench keeps it too: counted, and out of the MTTR percentiles only.
    eviction_summary = _benchmark("eviction_bench").summarize

    stalls = {"phases": {"survivors_stepping": 0.3}, "kind": "process_kill", "survivor_max_stall_s": 0.4}
    arm = eviction_summary(
        {
            "after": [
                {**stalls, "injected": True, "recovered": True, "mttr_s": 1.0},
                {**stalls, "injected": True, "recovered": False, "mttr_s": None, "survivor_max_stall_s": 9.0},
                {"kind": "node", "injected": False, "recovered": None},
            ]
        },
        failed_drills={"after": 1},
    )["after"]
    assert (arm["faults"], arm["recovered"], arm["not_recovered"], arm["not_injected"], arm["failed_drills"]) == (3, 1, 1, 1, 1)
    assert arm["stall_s"]["n"] == 2 and arm["stall_s"]["max"] == 9.0  # a fault's stall counts whether it recovered or not
    assert arm["mttr_s"]["n"] == 1


# ---------------------------------------------------------------- the rest of the definition
def test_diloco_counts_the_inner_steps_of_kept_windows_only():
    metrics, events, _ = _run("diloco_standby_2x1")
    lin = lineage(metrics, rollbacks_of(events))
    # Group 0 kept steps 0-49 (five windows); group 1 kept 0-29, died after its sync at 29, its
    # standby healed into the sync at 39 (its own window: nothing trained) and kept 40-49.
    assert {s for g, s in lin.useful if g == 0} == set(range(50))
    assert {s for g, s in lin.useful if g == 1} == set(range(30)) | set(range(40, 50))
    healed = [w for w in windows(metrics) if not w.kept]
    assert [(w.group, w.attempt, w.sync["step"], len(w.steps)) for w in healed] == [(1, 1, 39, 0)]
    # The replaced definition counted the syncs alone (one group-step per window).
    assert len(_committed(metrics)) == 10


def test_no_window_no_figure():
    assert goodput([], launch=0.0, groups=2) is None
    rec = {"group": 0, "rank": 0, "step": 0, "committed": True, "participating_groups": [0], "time": 1.0}
    assert goodput([rec], launch=1.0, groups=1) is None  # nothing after the launch
    assert goodput([rec], launch=0.0, groups=1).rate == 1.0
    assert goodput_ratio(None, 2.0) is None and goodput_ratio(1.0, None) is None and goodput_ratio(1.0, 0.0) is None
    assert goodput_ratio(1.0, 2.0) == 0.5
    assert median_step_s([rec]) is None


def test_the_drill_the_bench_and_the_reports_use_this_definition():
    import chaos.drill
    import chaos.goodput
    import chaos.mttr
    import monarch_ft.records.goodput as definition

    assert chaos.drill.goodput is definition.goodput and chaos.goodput.goodput is definition.goodput
    assert chaos.mttr.lineage is definition.lineage and chaos.mttr.windows is definition.windows


# ---------------------------------------------------------------- the bench's plan and faults
def test_bench_faults_are_seeded_poisson_arrivals_over_the_whole_cell():
    from chaos.goodput import faults_override, poisson_faults

    kinds = _bench_recipe().GoodputConfig().kinds
    assert poisson_faults(0, 90, seed=0, kinds=kinds) == []
    faults = poisson_faults(4, 600, seed=1, kinds=kinds)
    assert faults == poisson_faults(4, 600, seed=1, kinds=kinds) and faults != poisson_faults(4, 600, seed=2, kinds=kinds)
    times = [f["at_s"] for f in faults]
    assert times == sorted(times) and times[-1] < 600
    assert 20 <= len(faults) <= 60, len(faults)  # Poisson, mean 40 over 600 s
    # No quiet tail: over many draws, arrivals land in the last 10 s of a cell too.
    assert any(f["at_s"] >= 80 for s in range(40) for f in poisson_faults(2, 90, seed=s, kinds=kinds))
    assert {f["kind"] + (":" + f["mode"] if "mode" in f else "") for f in faults} <= set(kinds)
    assert not any(f["wait_standby"] for f in faults)
    assert faults_override([{"kind": "hang", "mode": "gil", "at_s": 1.5}]) == "chaos.faults=[{kind: hang, mode: gil, at_s: 1.5}]"


@pytest.mark.parametrize("overlap", [False, True])
def test_a_fault_due_while_another_recovers_fires_on_schedule_with_overlap(tmp_path, overlap):
    from chaos.config import FaultConfig
    from chaos.injector import ChaosInjector

    faults = [FaultConfig(kind="process_kill", at_s=1.0, wait_standby=False), FaultConfig(kind="process_kill", at_s=1.5, wait_standby=False)]
    job = FakeChaosJob(str(tmp_path))
    injector = ChaosInjector(faults, seed=0, allow_last_healthy=True, recovery_timeout_s=60, overlap=overlap)
    injector.tick(job, 101.2)
    assert len(job.killed) == 1  # the first, on time
    hit = job.killed[0]
    job.healthy = [g for g in (0, 1) if g != hit]  # it is being replaced: not back yet
    injector.tick(job, 101.6)
    if overlap:
        # Due, injected: the last healthy group or the one still coming back, as in production.
        assert len(job.killed) == 2 and len(injector.actives) == 2
    else:
        assert len(job.killed) == 1 and injector.blocked[1]["reason"] == "previous_not_recovered"
    # Once the job is asked to stop, nothing more fires: the cell is over.
    late = ChaosInjector([FaultConfig(kind="process_kill", at_s=1.0, wait_standby=False)], 0, True, 60, overlap=overlap)
    Path(job.run_layout.stop_request).parent.mkdir(parents=True, exist_ok=True)
    Path(job.run_layout.stop_request).write_text("1")
    killed = len(job.killed)
    late.tick(job, 105.0)
    assert len(job.killed) == killed and late.blocked[0]["reason"] == "job_stopping"


def test_a_second_fault_on_a_group_still_restarting_leaves_both_recovered_when_it_is_back():
    """full_restart_overlap_2x1: the goodput bench's full-restart cell (seed 7): group 1 SIGKILLed at
    13.0 s, and again 0.7 s later while every group was being restarted; back together at 19.9 s. The
    injector judged both recovered live (6.907 s and 6.235 s); the drill's analysis must agree."""
    from types import SimpleNamespace

    from chaos.drill import analyze_faults

    d = FIXTURES / "full_restart_overlap_2x1"
    metrics, events = _jsonl(d / "metrics.jsonl"), _jsonl(d / "events.jsonl")
    injected = json.loads((d / "injected.json").read_text())
    live = {e["fault_id"]: e["seconds"] for e in events if e["event"] == "fault_recovered"}
    assert live == {0: 6.907, 1: 6.235}

    def cfg(overlap):
        return SimpleNamespace(chaos=SimpleNamespace(overlap=overlap), ft=SimpleNamespace(recovery="full_restart", replica_groups=2, ranks_per_group=1))

    both = analyze_faults(injected, events, metrics, cfg(True))
    assert [(f["recovered"], f["mttr_s"]) for f in both] == [(True, 6.907), (True, 6.235)]
    # One-at-a-time analysis cuts the first fault's records at the second's injection: a drill that
    # fired them that way could not have; the bench's faults do, and must not be called unrecovered.
    cut = analyze_faults(injected, events, metrics, cfg(False))
    assert cut[0]["recovered"] is False and cut[1]["recovered"] is True


def test_bench_arms_interleave_with_their_own_fault_free_cells_over_repetitions():
    from chaos.goodput import NOFT, plan_cells

    plan = plan_cells([2], ["a", "b", "c"], repetitions=3, seed=7)
    shown = [f"{p.arm}{p.rate_per_min:g}" for p in plan]
    block = [NOFT + "0", "a0", "b0", "c0", "a2", "b2", "c2"]
    assert shown == block + block[::-1] + block
    assert [p.seed for p in plan] == [7] * 7 + [8] * 7 + [9] * 7
    assert {p.repetition for p in plan if p.arm == "a" and p.rate_per_min == 0} == {0, 1, 2}


def test_bench_intervals_closing_line_and_realised_rate():
    from chaos.goodput import NOFT, CellFigures, FaultOutcome, closing_line, summarize

    def cell(arm, rate, rep, r, injected=0, prov=2):
        faults = [FaultOutcome("process_kill", 1.0, True, True, 1.0)] * injected
        return CellFigures(arm, rate, rep, rep, 0.0, 60.0, 60.0, int(r * 60), int(r * 60), 0, r, r / prov, None, prov, 0.02, faults)

    cells = []
    for rep, (ff, f2, fr) in enumerate([(40.0, 38.0, 30.0), (44.0, 41.0, 31.0), (42.0, 40.5, 29.0), (41.0, 39.0, 30.5)]):
        cells += [cell(NOFT, 0, rep, 45.0), cell("live_standby", 0, rep, ff, prov=3), cell("full_restart", 0, rep, ff)]
        cells += [cell("live_standby", 2.0, rep, f2, 2, prov=3), cell("full_restart", 2.0, rep, fr, 2)]
    summaries = summarize(cells, groups=2)
    line = closing_line(summaries, cells)
    keys = dict(kv.split("=") for kv in line.split())
    standby = next(s for s in summaries if s.arm == "live_standby" and s.rate_per_min == 2.0)
    assert float(keys["goodput_standby_at_2pm"]) == pytest.approx(standby.goodput.value, abs=5e-4)
    assert float(keys["goodput_standby_at_2pm_lo"]) <= float(keys["goodput_standby_at_2pm"]) <= float(keys["goodput_standby_at_2pm_hi"])
    assert keys["goodput_diloco_standby_at_2pm"] == "n/a" and "goodput_full_restart_at_2pm_hi" in keys
    assert float(keys["goodput_standby_per_provisioned_at_2pm"]) == pytest.approx(standby.per_provisioned.value, abs=5e-4)
    assert float(keys["realised_rate_2pm"]) == pytest.approx(2.0)  # 2 faults per 60 s cell
    # ETTR: useful group-steps x the arm's fault-free median step (0.02 s) over 2 groups x 60 s.
    assert standby.ettr.value == pytest.approx(sum(int(r * 60) * 0.02 / 120 for r in (38.0, 41.0, 40.5, 39.0)) / 4)


def _benchmark(name: str):
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    return importlib.import_module(name)


def _bench_recipe():
    import importlib.util

    return importlib.import_module("monarch_ft.recipes.goodput_bench")


# ---------------------------------------------------------------- against the run's own pace
def _steady(pace_per_group: float, seconds: float, out_of: dict[int, tuple[float, float]] = {}) -> list[dict]:
    """hsdp step records of 2 groups at ``pace_per_group`` steps/s each from t=1000 for ``seconds``;
    group g trains nothing in ``out_of[g]`` = (from, to) seconds after the start (an outage)."""
    records = []
    for g in (0, 1):
        n = int(pace_per_group * seconds)
        step = 0
        for i in range(n):
            t = i / pace_per_group
            a, b = out_of.get(g, (None, None))
            if a is not None and a <= t < b:
                continue
            record = {"type": "step", "group": g, "rank": 0, "attempt": 0, "step": step, "committed": True, "time": 1000.0 + t}
            records.append({**record, "participating_groups": [0, 1]})
            step += 1
    return records


def _fault(at: float, back: float, fid: int = 0) -> list[dict]:
    return [
        {"event": "fault_injected", "fault_id": fid, "time": 1000.0 + at},
        {"event": "fault_recovered", "fault_id": fid, "time": 1000.0 + back + 0.05, "back_at": 1000.0 + back},
    ]


def test_own_pace_charges_an_outage_and_not_the_machines_speed():
    from monarch_ft.records.goodput import own_pace_kept

    # A 2 s outage of one group of two in 60 s: 20 group-steps of 1,200 lost at 10 steps/s a group.
    slow, fast = (own_pace_kept(_steady(p, 60.0, {1: (20.0, 22.0)}), _fault(20.0, 22.0)) for p in (10.0, 14.0))
    assert slow.kept == pytest.approx(1 - 20 / 1200, abs=0.003)
    # The same faults on a machine 40% faster: the same share kept (a ratio to another cell would
    # read the machine's speed: 1.4 here).
    assert fast.kept == pytest.approx(slow.kept, abs=0.003)
    assert fast.pace == pytest.approx(1.4 * slow.pace, rel=0.01)
    # Without the fault its seconds are clean: about 1 (the figure's own error).
    assert own_pace_kept(_steady(10.0, 60.0), []).kept == pytest.approx(1.0, abs=0.003)
    # A fault never back: its span runs to the end; the pace comes from the seconds before it.
    lost = own_pace_kept(_steady(10.0, 60.0, {1: (40.0, 99.0)}), _fault(40.0, 1e6)[:1])
    assert lost.clean_s == pytest.approx(40, abs=1)
    assert lost.kept == pytest.approx((400 + 600) / (20 * 60), abs=0.01)


def test_own_pace_counts_a_rollbacks_given_up_steps_zero():
    """The recorded full restart: steps 20-26 trained, given up, trained again. They are in the pace
    (what the job trains when undisturbed) and not in what it kept."""
    from monarch_ft.records.goodput import own_pace_kept

    metrics, events, _ = _run("full_restart_2x1")
    rollbacks = rollbacks_of(events)
    own = own_pace_kept(metrics, events, rollbacks)
    lin = lineage(metrics, rollbacks)
    assert own is not None and own.clean_s > 0  # the half second before the kill
    assert own.kept == pytest.approx(lin.count / (own.pace * own.seconds))
    # Counting every committed record instead (the replaced definition) would keep more.
    assert own.kept < len(_committed(metrics)) / (own.pace * own.seconds)
