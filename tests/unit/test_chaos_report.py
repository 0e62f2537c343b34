"""chaos.report on synthetic drills: no training, just the files a drill leaves behind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from chaos.report import PHASES, phase_increments, phase_stats, write_aggregate_report, write_drill_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1796223589.6


def _fault(fid, kind, at, phases, *, target=1, recovered=True, stall=1.0, consistent=True):
    reached = [v for v in phases.values() if v is not None]
    return {
        "id": fid,
        "kind": kind,
        "target": target,
        "rank": 0,
        "at_step": 10 + 10 * fid,
        "injected_at": T0 + at,
        "phases": phases,
        "mttr_s": max(reached) if (reached and recovered) else None,
        "recovered": recovered,
        "weights_consistent": consistent,
        "survivor_max_stall_s": stall,
        "survivor_steps_lost": 0,
        "recovery_bytes": 36982500 + fid,
        "recovery_seconds": 0.4 + 0.1 * fid,
        "recovered_from_group": 0 if target else 1,
    }


def _drill(recovery="live", scale=1.0):
    s = scale
    live = recovery != "full_restart"
    faults = [
        _fault(
            0,
            "process_kill",
            10.0,
            {"detected": 0.05, "survivors_stepping": 1.2 if live else None, "replacement_up": 7.5 * s, "weights_recovered": 8.1 * s, "back_in_quorum": 8.6 * s},
            stall=1.1,
        ),
        _fault(
            1,
            "process_kill",
            25.0,
            {"detected": 0.07, "survivors_stepping": 0.9 if live else None, "replacement_up": 6.5 * s, "weights_recovered": 7.0 * s, "back_in_quorum": 7.9 * s},
            stall=0.8,
        ),
        _fault(
            2,
            "process_kill",
            40.0,
            {
                "detected": 0.04,
                "survivors_stepping": 1.5 if live else None,
                "replacement_up": 9.0 * s,
                "weights_recovered": 9.9 * s,
                "back_in_quorum": 10.4 * s,
            },
            stall=1.6,
        ),
        # A collective fault restarts nothing: replacement/weights phases are None.
        _fault(
            3,
            "collective",
            50.0,
            {"detected": 0.5, "survivors_stepping": 1.0 * s, "replacement_up": None, "weights_recovered": None, "back_in_quorum": 2.0 * s},
            target=None,
            stall=0.5,
        ),
        _fault(
            4,
            "collective",
            55.0,
            {
                "detected": 0.3,
                "survivors_stepping": 0.7 * s,
                "replacement_up": None,
                "weights_recovered": None,
                "back_in_quorum": 1.5 * s,
                "custom_extra": 1.7 * s,
            },
            target=None,
            stall=0.25,
        ),
    ]
    return {
        "recovery": recovery,
        "launcher": "local",
        "seed": 0,
        "steps": 60,
        "started_at": T0,
        "finished_at": T0 + 60.5,
        "fault_free_batches_per_s": 8.1,
        "goodput_batches_per_s": 6.0 / s,
        "goodput_ratio": 0.74 / s,
        "weights_consistent": True,
        "replica_groups": 2,
        "ranks_per_group": 2,
        "faults": faults,
    }


def _metrics():
    out = []
    for group in (0, 1):
        for rank in (0, 1):
            for step in range(60):
                out.append(
                    {
                        "type": "step",
                        "group": group,
                        "rank": rank,
                        "attempt": 0,
                        "step": step,
                        "committed": step % 7 != 3,
                        "loss": 6.1 - step * 0.01,
                        "tokens_per_s": 900.0,
                        "quorum_size": 2,
                        "participating_groups": [0, 1],
                        "time": T0 + 1.0 + step + 0.1 * group,
                    }
                )
    return out


def _tables(md: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table in md as (header, rows)."""
    tables, cur = [], None
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cur is None:
                cur = (cells, [])
            elif not all(set(c) <= set("-:") for c in cells):
                cur[1].append(cells)
        elif cur is not None:
            tables.append(cur)
            cur = None
    if cur is not None:
        tables.append(cur)
    return tables


def _kind_table(md: str):
    for header, rows in _tables(md):
        if header[:2] == ["kind", "count"]:
            return header, {r[0]: dict(zip(header, r)) for r in rows}
    raise AssertionError("no per-kind table in report.md")


def _f2(x):
    return "n/a" if x is None else f"{x:.2f}"


def _assert_png(path: str, min_bytes: int = 10_000, height_in: float = 5.0):
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes
    # IHDR width/height: about 10 x height_in in at 120 dpi.
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert 1000 <= w <= 1400 and 100 * height_in <= h <= 140 * height_in, (w, h)


def test_phase_stats_skips_none_and_uses_linear_percentiles():
    drill = _drill()
    st = phase_stats(drill["faults"])
    assert list(st) == ["process_kill", "collective"]
    pk, co = st["process_kill"], st["collective"]
    assert pk["count"] == 3 and pk["recovered"] == 3
    mttrs = [8.6, 7.9, 10.4]
    assert pk["mttr"]["mean"] == pytest.approx(np.mean(mttrs))
    assert pk["mttr"]["p50"] == pytest.approx(8.6)
    assert pk["mttr"]["p95"] == pytest.approx(np.percentile(mttrs, 95))
    assert list(pk["phases"]) == list(PHASES)
    stall = pk["survivor_max_stall_s"]
    assert (stall["n"], stall["mean"], stall["max"], stall["p50"]) == (3, pytest.approx(3.5 / 3), 1.6, 1.1)
    # Every percentile carries its n, the max and a 95% interval drawn from the values themselves.
    assert pk["mttr"]["n"] == 3 and pk["mttr"]["max"] == 10.4
    assert 7.9 <= pk["mttr"]["p50_ci"][0] <= 8.6 <= pk["mttr"]["p50_ci"][1] <= 10.4
    # None phases are skipped, not counted as zero; unknown phases are appended.
    assert list(co["phases"]) == list(PHASES) + ["custom_extra"]
    assert co["phases"]["replacement_up"] == {"n": 0, "mean": None, "p50": None, "p50_ci": None, "p95": None, "p95_ci": None, "max": None}
    assert co["phases"]["custom_extra"]["mean"] == pytest.approx(1.7)
    assert co["phases"]["survivors_stepping"]["mean"] == pytest.approx(0.85)

    mixed = [_fault(0, "hang", 0, {"detected": 1.0, "replacement_up": None}), _fault(1, "hang", 0, {"detected": 3.0, "replacement_up": 5.0}, recovered=False)]
    hs = phase_stats(mixed)["hang"]
    assert hs["phases"]["replacement_up"] == {"n": 1, "mean": 5.0, "p50": 5.0, "p50_ci": None, "p95": 5.0, "p95_ci": None, "max": 5.0}
    assert hs["phases"]["detected"]["p95"] == pytest.approx(2.9)
    assert hs["recovered"] == 1 and hs["not_recovered"] == 1
    assert hs["mttr"]["mean"] == pytest.approx(1.0)  # the unrecovered fault's None MTTR is skipped
    assert phase_stats([]) == {}


def test_phase_increments_are_not_cumulative():
    inc = phase_increments(_drill()["faults"])
    pk = inc["process_kill"]
    assert pk["detected"] == pytest.approx(np.mean([0.05, 0.07, 0.04]))
    assert pk["replacement_up"] == pytest.approx(np.mean([7.5 - 1.2, 6.5 - 0.9, 9.0 - 1.5]))
    assert sum(pk.values()) == pytest.approx(np.mean([8.6, 7.9, 10.4]))
    co = inc["collective"]
    assert co["replacement_up"] == 0.0 and co["weights_recovered"] == 0.0
    assert co["back_in_quorum"] == pytest.approx(np.mean([1.0, 0.8]))


@pytest.mark.parametrize("with_baseline", [False, True])
def test_drill_report_matches_phase_stats(tmp_path, with_baseline):
    drill = _drill("live")
    baseline = _drill("full_restart", scale=3.0) if with_baseline else None
    paths = write_drill_report(str(tmp_path), drill, _metrics(), baseline)
    assert set(paths) == {"report", "timeline", "mttr"}
    assert paths["report"] == str(tmp_path / "report.md")
    for name in ("timeline", "mttr"):
        assert Path(paths[name]).parent == tmp_path
        _assert_png(paths[name], height_in=7.5 if name == "timeline" else 5.0)  # the timeline has a throughput panel

    md = Path(paths["report"]).read_text()
    assert "![timeline](timeline.png)" in md and "![mttr](mttr.png)" in md
    assert "live" in md and "local" in md
    assert md.rstrip().splitlines()[-1].endswith("Weights consistent across replicas: yes**")
    if not with_baseline:
        assert "baseline was not run" in md

    stats = phase_stats(drill["faults"])
    base_stats = phase_stats(baseline["faults"]) if baseline else {}
    header, rows = _kind_table(md)
    assert set(rows) == set(stats)
    for kind, st in stats.items():
        row = rows[kind]
        assert row["count"] == str(st["count"])
        assert row["recovered"] == str(st["recovered"])
        assert row["not recovered"] == str(st["not_recovered"]) and row["MTTR n"] == str(st["mttr"]["n"])
        assert row["MTTR mean (s)"] == _f2(st["mttr"]["mean"])
        ci = st["mttr"]["p50_ci"]
        assert row["MTTR p50 [95% CI] (s)"] == _f2(st["mttr"]["p50"]) + (f" [{_f2(ci[0])}, {_f2(ci[1])}]" if ci else "")
        assert row["MTTR p95 [95% CI] (s)"].split(" ")[0] == _f2(st["mttr"]["p95"])
        assert row["MTTR max (s)"] == _f2(st["mttr"]["max"])
        for phase in PHASES:
            assert row[f"{phase} mean (s)"] == _f2(st["phases"][phase]["mean"])
        assert row["survivors' longest stall p50 [95% CI] (s)"].split(" ")[0] == _f2(st["survivor_max_stall_s"]["p50"])
        assert row["stall max (s)"] == _f2(st["survivor_max_stall_s"]["max"])
        assert row["goodput ratio"] == "0.74"
        if with_baseline:
            b = base_stats[kind]["mttr"]["mean"]
            assert row["baseline MTTR mean (s)"] == _f2(b)
            assert row["ratio (baseline/ours)"] == _f2(b / st["mttr"]["mean"])
            assert float(row["ratio (baseline/ours)"]) == pytest.approx(3.0, abs=0.01)
        else:
            assert row["baseline MTTR mean (s)"] == "n/a"
            assert row["ratio (baseline/ours)"] == "n/a"
    # None phases are reported as n/a, never as 0.00.
    assert rows["collective"]["replacement_up mean (s)"] == "n/a"
    assert rows["collective"]["weights_recovered mean (s)"] == "n/a"
    assert header.index("back_in_quorum mean (s)") < header.index("custom_extra mean (s)")

    per_fault = next(rows for h, rows in _tables(md) if h[:2] == ["id", "kind"])
    per_header = next(h for h in (t[0] for t in _tables(md)) if h[:2] == ["id", "kind"])
    assert len(per_fault) == len(drill["faults"])
    for cells, fault in zip(per_fault, drill["faults"]):
        row = dict(zip(per_header, cells))
        assert row["id"] == str(fault["id"]) and row["kind"] == fault["kind"]
        assert row["mttr_s"] == _f2(fault["mttr_s"])
        for phase in PHASES:
            assert row[phase] == _f2(fault["phases"][phase])
        assert row["recovery MB"] == _f2(fault["recovery_bytes"] / 1e6)
        assert row["recovery s"] == _f2(fault["recovery_seconds"])
        assert row["weights_consistent"] == "yes"


def test_drill_report_tolerates_sparse_input(tmp_path):
    drill = {
        "recovery": "live",
        "faults": [
            {"id": 0, "kind": "segfault", "injected_at": T0, "phases": {"detected": None}, "mttr_s": None, "recovered": False, "weights_consistent": False}
        ],
    }
    paths = write_drill_report(str(tmp_path), drill, [])
    for name in ("timeline", "mttr"):
        assert Path(paths[name]).read_bytes()[:8] == PNG_SIGNATURE
    md = Path(paths["report"]).read_text()
    _, rows = _kind_table(md)
    assert rows["segfault"]["MTTR mean (s)"] == "n/a" and rows["segfault"]["recovered"] == "0"
    assert md.rstrip().endswith("Weights consistent across replicas: no**")


def test_aggregate_report_summary_ratio(tmp_path):
    drills = [_drill("live"), _drill("live", scale=1.2), _drill("full_restart", scale=3.0), _drill("full_restart", scale=2.5)]
    # A kind only one side ran has no ratio.
    drills[0]["faults"].append(_fault(9, "sigterm", 58.0, {"detected": 0.01, "back_in_quorum": 5.0}))
    paths = write_aggregate_report(str(tmp_path / "sweep"), drills)
    assert set(paths) == {"report", "mttr", "summary"}
    _assert_png(paths["mttr"])
    summary = json.loads(Path(paths["summary"]).read_text())
    assert summary["ours"] == "live" and summary["recoveries"] == ["live", "full_restart"]

    ours_faults = drills[0]["faults"] + drills[1]["faults"]
    base_faults = drills[2]["faults"] + drills[3]["faults"]
    ours, base = phase_stats(ours_faults), phase_stats(base_faults)
    for kind in ("process_kill", "collective"):
        o = summary["stats"][kind]["live"]["mttr"]["mean"]
        b = summary["stats"][kind]["full_restart"]["mttr"]["mean"]
        assert o == pytest.approx(ours[kind]["mttr"]["mean"])
        assert b == pytest.approx(base[kind]["mttr"]["mean"])
        assert summary["ratio"][kind] == pytest.approx(b / o)
        assert summary["stats"][kind]["live"]["count"] == ours[kind]["count"]
    assert summary["ratio"]["sigterm"] is None
    assert "full_restart" not in summary["stats"]["sigterm"]
    assert summary["stats"]["process_kill"]["live"]["goodput_ratio"] == pytest.approx((0.74 + 0.74 / 1.2) / 2)
    assert summary["weights_consistent"] is True

    md = Path(paths["report"]).read_text()
    assert "![mttr](mttr.png)" in md
    ratio_table = next(rows for h, rows in _tables(md) if h[0] == "kind" and "ratio (full restart/ours)" in h)
    by_kind = {r[0]: r for r in ratio_table}
    assert by_kind["process_kill"][3] == _f2(summary["ratio"]["process_kill"])
    assert by_kind["sigterm"][3] == "n/a"
    assert not any(isinstance(v, float) and math.isnan(v) for v in summary["ratio"].values())


def test_the_per_fault_table_shows_throughput_and_the_timeline_series_the_rate(tmp_path):
    from chaos.report import step_rate_series

    drill = _drill("live")
    drill["faults"][0]["throughput_group_steps_per_s"] = {"before": 2.0, "during": 0.8, "after": 1.9, "ratio": 0.95}
    drill["faults"][0]["throughput_ratio"], drill["faults"][0]["evicted"] = 0.95, True
    paths = write_drill_report(str(tmp_path), drill, _metrics())
    md = Path(paths["report"]).read_text()
    assert "| group-steps/s before | during | after | throughput ratio |" in md
    assert "| 2.00 | 0.80 | 1.90 | 0.95 (evicted) |" in md
    # Group-steps: two groups stepping together at 2 steps/s read 4 group-steps/s.
    recs = [{"group": g, "rank": 0, "committed": True, "step": s, "time": 100.0 + s * 0.5 + g * 0.01} for s in range(25) for g in (0, 1)]
    series = step_rate_series(recs, window=10)
    assert len(series) == 40 and all(r == pytest.approx(4.0, rel=0.05) for _, r in series)
