"""The report floor bench (benchmarks/report_floor.py) on a few real files: its reads count every record."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import report_floor  # noqa: E402

from monarch_ft.records.report_records import StepRecord, parse_record


def test_the_benchs_record_is_a_step_record_the_tick_reads():
    line = report_floor.step_line(3, 8, 41)
    rec = parse_record(json.loads(line), line.rstrip(b"\n"))
    assert isinstance(rec, StepRecord) and rec.step == 41 and rec.group == 3


def test_each_stage_is_measured_every_round(capsys):
    got = report_floor.measure(files=3, rounds=2)
    assert sorted(got) == sorted(report_floor.STAGES) and all(len(v) == 2 and all(x >= 0 for x in v) for v in got.values())
    assert report_floor.main(["--files", "3", "--rounds", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("read_us=") and "budget_us=3333.33" in last


def test_no_files_is_refused_in_one_line(capsys):
    assert report_floor.main(["--files", "0"]) == 2
    assert capsys.readouterr().err.strip() == "report_floor: --files and --rounds must be at least 1"
