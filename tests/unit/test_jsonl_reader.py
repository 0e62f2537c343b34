"""The one reader of the project's JSON-lines files (records.reports): whole, from an offset, a tail."""

from __future__ import annotations

import json

from monarch_ft.records.layout import read_jsonl
from monarch_ft.records.reports import ReportTail, read_records, tail_records


def _write(path, records, torn: str = "") -> list[int]:
    """Write the records a line each, then ``torn`` (half a line); the offset of each line."""
    offsets, text = [], ""
    for rec in records:
        offsets.append(len(text))
        text += json.dumps(rec) + "\n"
    path.write_text(text + torn)
    return offsets


def test_a_torn_last_line_and_a_missing_file_are_no_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(str(path)) == [] and tail_records(str(path), 100) == [] and list(read_records(str(path))) == []
    _write(path, [{"step": 0}, {"step": 1}], torn='{"step": 2, "lo')
    assert read_jsonl(str(path)) == [{"step": 0}, {"step": 1}]
    # The incremental reader agrees, and returns the torn line once it is whole.
    tail = ReportTail(str(path))
    assert tail.read() == [{"step": 0}, {"step": 1}]
    with open(path, "a") as f:
        f.write('ss": 1.5}\n')
    assert tail.read() == [{"step": 2, "loss": 1.5}]
    tail.close()


def test_from_an_offset_a_line_started_before_it_is_skipped(tmp_path):
    path = tmp_path / "report.jsonl"
    offsets = _write(path, [{"step": s, "committed": s % 2 == 0} for s in range(5)])
    assert [r["step"] for r in read_records(str(path), offsets[2])] == [2, 3, 4]  # at a line's start: from it
    assert [r["step"] for r in read_records(str(path), offsets[2] + 1)] == [3, 4]  # mid-line: from the next
    assert [r["step"] for r in read_records(str(path), 0, offsets[3])] == [0, 1, 2]  # lines starting before end
    assert [r["step"] for r in read_records(str(path), having=b'"committed": true')] == [0, 2, 4]
    size = path.stat().st_size
    assert [r["step"] for r in tail_records(str(path), size - offsets[3])] == [3, 4]
    assert [r["step"] for r in tail_records(str(path), size - offsets[3] + 1)] == [3, 4]  # a partial line dropped


def test_a_tail_gives_each_record_with_its_line_as_written(tmp_path):
    """The controller relays a step's line to metrics.jsonl as the rank wrote it (no second
    encoding): the line is the one in the file, and decodes to the record."""
    path = tmp_path / "r0.jsonl"
    recs = [{"type": "step", "step": 0, "loss": 0.1 + 0.2, "name": "caf\u00e9"}, {"type": "step", "step": 1, "participating_groups": [0, 1]}]
    _write(path, recs, torn='{"type": "st')
    tail = ReportTail(str(path))
    got = tail.read_lines()
    assert [r for r, _ in got] == recs
    assert [line for _, line in got] == [json.dumps(r).encode() for r in recs]
    assert b"\n".join(line for _, line in got) + b"\n" + b'{"type": "st' == path.read_bytes()
    tail.close()


def test_each_line_keeps_its_own_record_whatever_a_bad_line_beside_it_holds():
    """A line that is not one record (damaged, two values, blank) is skipped alone: each good
    line beside it keeps its own record and its own bytes."""
    from monarch_ft.records.reports import parse_lines_kept

    good = [json.dumps({"step": s}).encode() for s in range(3)]
    assert list(parse_lines_kept(good)) == [({"step": s}, good[s]) for s in range(3)]
    for bad in (b'{"step": 9', b"1, 2", b"", b"{}{}"):
        lines = [good[0], bad, good[2]]
        assert list(parse_lines_kept(lines)) == [({"step": 0}, good[0]), ({"step": 2}, good[2])], bad


def test_a_line_is_read_as_json_loads_reads_it():
    """The reader hands the usual line (``{"``...) straight to json's decoder: for every line, odd
    ones included, it gives what ``json.loads`` gives, and skips what json.loads refuses."""
    from monarch_ft.records.reports import parse_lines

    lines = [b'{"a": 1}', b' {"a": 1}', b'{"a": 1} ', b'{"a": 1', b'{"a": "\xff"}', b'{"a": "\xed\xa0\x80"}', b"\xef\xbb\xbf" + b'{"a": 1}']
    lines += [b"[1]", b'{"a": 1}{"b": 2}', b"", b'{"', '{"é": "ü"}'.encode(), '{"a": 1}'.encode("utf-16")]

    def loads(line):
        try:
            return [json.loads(line)]
        except ValueError:
            return []

    for line in lines:
        assert list(parse_lines([line])) == loads(line), line
