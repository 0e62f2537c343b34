"""The scale bench's arithmetic on a recorded cell (benchmarks/scale_bench.py): no job runs here."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import scale_bench  # noqa: E402


def _drill(mttrs, stalls):
    faults = [{"injected": True, "recovered": True, "mttr_s": m, "survivor_max_stall_s": s, "kind": "process_kill"} for m, s in zip(mttrs, stalls)]
    faults.append({"injected": True, "recovered": False, "mttr_s": None, "survivor_max_stall_s": 9.0, "kind": "node"})
    return {"faults": faults}


def _summary(ticks, cpu_s, wall_s):
    return {
        "status": "completed",
        "job_step": 80,
        "controller": {"controllers": 1, "watch_loop": {"ticks": ticks, "cpu_s": cpu_s, "cpu_s_per_tick": cpu_s / ticks, "wall_s": wall_s}},
    }


def _metrics(quorums):
    recs = [{"type": "step", "step": i, "committed": True, "quorum_s": q, "step_time_s": 0.5} for i, q in enumerate(quorums)]
    recs.append({"type": "step", "step": 99, "committed": False, "quorum_s": 5.0})  # an uncommitted step is not counted
    return recs


def test_cell_figures_from_a_recorded_cell():
    cell = scale_bench.cell_figures(
        4, _drill([1.0, 2.0, 3.0], [0.2, 0.4, 0.6]), _summary(1000, 4.0, 60.0), _metrics([0.01, 0.03, 0.02]), {"total": 4000.0, "ranks": 2000.0}
    )
    assert cell["faults"] == 4 and cell["recovered"] == 3  # the unrecovered fault is left out of the percentiles
    assert cell["mttr_p50_s"] == 2.0 and cell["stall_p50_s"] == 0.4
    assert cell["step_p50_s"] == 0.5 and cell["mttr_p50_steps"] == 4.0
    assert abs(cell["stall_p95_s"] - 0.58) < 1e-9
    assert cell["controller_cpu_per_tick_ms"] == 4.0 and cell["controller_cpu_per_tick_per_group_ms"] == 1.0
    assert abs(cell["controller_cpu_share"] - 0.067) < 1e-9 and cell["controller_tick_ms"] == 60.0
    assert cell["quorum_steps"] == 3 and cell["quorum_p50_ms"] == 20.0
    assert cell["rss_peak_mb"] == 4000.0 and cell["rss_peak_by_role_mb"] == {"ranks": 2000.0}


def test_a_cell_without_the_controller_section_has_no_cost_figure():
    cell = scale_bench.cell_figures(2, {"faults": []}, {}, [], {})
    assert cell["controller_cpu_per_tick_ms"] is None and cell["mttr_p50_s"] is None and cell["quorum_p50_ms"] is None


def test_closing_line_is_largest_over_smallest_cell():
    small = scale_bench.cell_figures(2, _drill([1.0], [0.3]), _summary(100, 0.2, 10.0), _metrics([0.01]), {"total": 1000.0})
    large = scale_bench.cell_figures(16, _drill([1.5], [0.6]), _summary(100, 3.2, 10.0), _metrics([0.05]), {"total": 8000.0})
    small["rss_per_group_mb"], large["rss_per_group_mb"] = 500.0, 500.0
    line = scale_bench.closing_line([large, small])
    assert line.startswith("mttr_p50_16_over_2=1.5 ")
    assert "stall_p50_16_over_2=2.0 controller_cpu_per_tick_per_group_16_over_2=2.0 quorum_p50_16_over_2=5.0" in line
    assert "rss_peak_per_group_16_over_2=1.0" in line


def test_faults_alternate_kind_and_target():
    assert scale_bench.faults_override(3, 16, 15, 20) == (
        "chaos.faults=[{kind: process_kill, at_step: 15, target: 1}, {kind: node, at_step: 35, target: 0}, {kind: process_kill, at_step: 55, target: 1}]"
    )
