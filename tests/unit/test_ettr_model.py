"""The ETTR model's arithmetic (benchmarks/ettr_model.py) on a fixture drill and goodput run: no job runs."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import ettr_model as em  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ettr")
DRILL = os.path.join(FIXTURE, "drill.json")


def test_the_failure_table_is_met_at_its_points_and_interpolated_log_log():
    assert em.mttf_s(1024) == pytest.approx(7.9 * 3600)
    assert em.mttf_s(16384) == pytest.approx(1.8 * 3600)
    assert em.mttf_s(131072) == pytest.approx(14 * 60)
    # Halfway in log GPUs between two points: halfway in log MTTF.
    assert em.mttf_s(4096) == pytest.approx(math.sqrt(7.9 * 1.8) * 3600)
    assert em.mttf_s(1024) > em.mttf_s(4096) > em.mttf_s(100000) > em.mttf_s(131072)


def test_daly_interval():
    assert em.daly_interval(10.0, 3600.0, 300.0) == pytest.approx(math.sqrt(2 * 10 * 3900) - 10)
    assert em.daly_interval(0.0, 3600.0, 300.0) == float("inf")
    assert em.daly_interval(8000.0, 3600.0, 300.0) == 3600.0  # a save longer than twice the MTTF


def test_a_drill_s_phases_are_its_relaunched_faults_mean():
    ph = em.read_phases(DRILL, "live_standby")
    assert (ph.detect_s, ph.up_s, ph.rejoin_s, ph.stall_s, ph.mttr_s) == pytest.approx((0.2, 0.2, 0.4, 1.1, 1.5))
    assert ph.heal_s == pytest.approx(0.02) and ph.heal_gbps == pytest.approx(1e6 / 0.02 / 1e9)


def test_the_projection_orders_the_arms_and_charges_the_spares():
    phases = {arm: em.read_phases(DRILL, arm) for arm in ("live_standby", "live_fork", "full_restart")}
    a = em.Assumptions()
    rows = em.table(list(em.SHAPES.values()), list(em.SCALES), list(em.ARMS), phases, a)
    assert len(rows) == len(em.SHAPES) * len(em.SCALES) * len(em.ARMS)
    by = {(r.shape, r.gpus, r.arm): r for r in rows}
    for shape in em.SHAPES:
        for gpus in em.SCALES:
            live, fork, full, noft = (by[(shape, gpus, arm)] for arm in em.ARMS)
            assert live.ettr > full.ettr > noft.ettr and fork.ettr > full.ettr
            assert live.goodput == pytest.approx(live.ettr * live.groups / (live.groups + a.standby_groups))
            assert full.ckpt_interval_s == pytest.approx(
                em.daly_interval(full.notes["save_s"], em.mttf_s(gpus), phases["full_restart"].detect_s + a.restart_s + full.notes["load_s"]), rel=1e-2
            )
        # Failures grow with the scale: every arm loses more of its time.
        assert by[(shape, 1024, "full_restart")].ettr > by[(shape, 100000, "full_restart")].ettr
        noft = [by[(shape, gpus, "no_ft")].ettr for gpus in em.SCALES]
        assert noft == sorted(noft, reverse=True) and noft[0] > noft[-1]
    # 8B in groups of 8 GPUs: 12 GB of state per GPU, healed at 25 GB/s.
    assert by[("8b", 1024, "live_standby")].notes["heal_s"] == pytest.approx(8.0e9 * 12 / 8 / 25e9, rel=1e-2)


def _bench_run(folder: str) -> str:
    """A goodput_bench run's goodput.json written by the bench's own writer (its plot left out): 2 groups,
    3 repetitions, a 0.1 s fault-free step; ``live_standby`` lost what the model prices, ``diloco_standby``
    far more, ``elastic`` is an arm the model has none for."""
    from chaos.goodput import NOFT, CellFigures, FaultOutcome, summarize

    from monarch_ft.recipes import goodput_bench

    faults = [
        FaultOutcome("process_kill", 5.0, True, True, 1.5),
        FaultOutcome("node", 20.0, True, True, 1.5),
        FaultOutcome("collective", 40.0, True, True, 0.1),
    ]
    rates = {  # useful group-steps/s per repetition: fault-free, then at 2 faults/min
        "live_standby": ((16.0, 16.5, 15.5), (15.2, 15.8, 14.7)),
        "diloco_standby": ((16.0, 16.5, 15.5), (12.0, 12.5, 11.8)),
        "elastic": ((16.0, 16.5, 15.5), (15.0, 15.0, 15.0)),
    }
    cells = []
    for rep in range(3):
        cells.append(CellFigures(NOFT, 0.0, rep, rep, 0.0, 60.0, 60.0, 1080, 1080, 0, 18.0, 9.0, 2304.0, 2, 0.1))
        for rate_per_min in (0.0, 2.0):
            for arm, (ff, hit) in rates.items():
                rate = (ff if rate_per_min == 0 else hit)[rep]
                cells.append(
                    CellFigures(
                        arm,
                        rate_per_min,
                        rep,
                        rep,
                        0.0,
                        60.0,
                        60.0,
                        int(rate * 60),
                        int(rate * 60),
                        0,
                        rate,
                        rate / 3,
                        rate * 128,
                        3,
                        0.1,
                        list(faults) if rate_per_min else [],
                    )
                )
    meta = {
        "cell_s": 60.0,
        "repetitions": 3,
        "seed": 0,
        "rates": [0.0, 2.0],
        "arms": list(rates),
        "groups": 2,
        "ranks_per_group": 1,
        "tokens_per_group_step": 128,
        "kinds": ["process_kill", "node", "collective"],
        "overrides": [],
        "started": 0.0,
    }
    original = goodput_bench._plot
    goodput_bench._plot = lambda *a, **k: None
    try:
        goodput_bench.write_outputs(folder, cells, summarize(cells, 2), meta)
    finally:
        goodput_bench._plot = original
    return os.path.join(folder, "goodput.json")


def test_the_check_prices_each_fault_by_kind_at_the_realised_rate(tmp_path):
    run = _bench_run(str(tmp_path))
    phases = {arm: em.read_phases(DRILL, arm) for arm in ("live_standby", "live_fork", "full_restart")}
    rows = {r["arm"]: r for r in em.check(str(tmp_path), phases, ckpt_interval_steps=10, summary=DRILL)}
    assert set(rows) == {"live_standby", "diloco_standby", "elastic"}  # every arm at 2/min, no-FT and rate 0 not rows
    live = rows["live_standby"]
    assert live["realised_rate_per_min"] == pytest.approx(3.0) and live["kinds"] == ["process_kill", "node", "collective"] * 3
    # A relaunch: 1 survivor x its stall + the MTTR + a step (the fixture drill: stall 1.0-1.2, mean 1.1; MTTR 1.5);
    # the aborted collective recovers in place: 2 groups x the recorded stall, in the middle and at both ends.
    per_fault = [(2 * (stall + 1.5 + 0.1) + 2 * em.ABORTED_COLLECTIVE_STALL_S) / 3 for stall in (1.0, 1.1, 1.2)]
    assert live["lost_per_fault_group_s"] == pytest.approx(per_fault)
    pred = live["predicted_goodput"]
    assert (pred["hi"], pred["value"], pred["lo"]) == pytest.approx([1 - 3.0 / 60 * x / 2 for x in per_fault])
    measured = live["measured_goodput"]
    assert measured["n"] == 3 and measured["lo"] <= measured["value"] <= measured["hi"]
    assert live["goodput_agrees"] is True and live["ettr_agrees"] is True
    # ETTR: the arm's measured fault-free ETTR (16 group-steps/s x 0.1 s / 2 groups) times the ratio.
    assert live["predicted_ettr"]["value"] == pytest.approx(0.8 * pred["value"])
    diloco = rows["diloco_standby"]
    assert diloco["model_arm"] == "live_standby" and "no DiLoCo arm" in diloco["note"]
    assert diloco["goodput_agrees"] is False and diloco["ettr_agrees"] is False
    assert rows["elastic"]["model_arm"] is None
    with open(run) as f:
        assert "summary" in json.load(f)


def test_the_check_prints_a_row_per_arm_and_rate(tmp_path, capsys, monkeypatch):
    _bench_run(str(tmp_path))
    monkeypatch.setattr(em, "RECORDED", {"live_standby": DRILL, "live_fork": DRILL, "full_restart": DRILL})
    monkeypatch.setattr(em, "check", lambda run, ph, n, summary=None, _check=em.check: _check(run, ph, n, summary=DRILL))
    em.main(["--check", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0][2:]: line for line in out if line.startswith("| ") and not line.startswith("| arm ")}
    assert set(rows) == {"live_standby", "diloco_standby", "elastic"}
    assert "| inside |" in rows["live_standby"] and rows["live_standby"].count("inside") == 2
    assert rows["diloco_standby"].count("**outside**") == 2 and "not modelled" in rows["elastic"]
    assert any(line.startswith("elastic: the model has no arm") for line in out)


BAD = [("{not json", "is not JSON"), ('{"cells": [{"arm": "live", "ratio": 0.9}]}', "before its rework"), ("[]", "not a goodput_bench")]


@pytest.mark.parametrize("text, says", BAD)
def test_a_bad_goodput_json_is_one_line_and_exit_2(tmp_path, capsys, text, says):
    path = tmp_path / "goodput.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        em.main(["--check", str(path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err and says in err
    with pytest.raises(SystemExit) as e:
        em.main(["--check", str(tmp_path / "missing")])
    assert e.value.code == 2 and "cannot read" in capsys.readouterr().err


def test_with_no_arguments_it_prints_a_row_per_shape_scale_and_arm(capsys):
    em.main([])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 8b |") or line.startswith("| 70b |")]
    assert len(rows) == len(em.SHAPES) * len(em.SCALES) * len(em.ARMS)
    assert out.strip().splitlines()[-1].startswith("ettr_8b_100000_live_standby=")


def test_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        em.main(["--shapes", "13b"])
    assert e.value.code == 2 and "monarch_ft: error: --shapes" in capsys.readouterr().err
