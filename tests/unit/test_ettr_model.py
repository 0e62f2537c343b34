"""The ETTR model's arithmetic (benchmarks/ettr_model.py) on a fixture drill and goodput run: no job runs."""

from __future__ import annotations

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


def test_the_check_prices_each_injected_fault_by_its_kind():
    phases = {"live_standby": em.read_phases(DRILL, "live_standby")}
    (row,) = em.check(os.path.join(FIXTURE, "run"), phases, ckpt_interval_steps=10, summary=DRILL)
    # 4 groups, 60 s cells, a 0.1 s step (4 groups / 40 group-steps/s).
    # The cell's own phases: (3 x 1.0 + 1.5 + 0.1) + (3 x 1.2 + 1.5 + 0.1) + 4 x 0.1 (the aborted collective).
    assert row["predicted_own_phases"] == pytest.approx(1 - (4.6 + 5.2 + 0.4) / 240)
    # The recorded phases (the fixture drill's mean for both relaunches, the recorded in-place stall for the collective).
    assert row["predicted"] == pytest.approx(1 - (2 * (3 * 1.1 + 1.5 + 0.1) + 4 * em.ABORTED_COLLECTIVE_STALL_S) / 240)
    assert row["measured"] == 0.95 and row["kinds"] == ["process_kill", "node", "collective"]


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
