"""What reading the rank reports alone costs the controller per step record: the floor under its tick.

    python benchmarks/report_floor.py                   # 1,024 rank files, 30 rounds
    python benchmarks/report_floor.py --files 128 --rounds 10

The controller learns of a group's step from a line its rank appends to a report file of its own
(``records/reports.py``), and each tick reads every file on from where it stopped. Whatever the tick
then does with a record, it first pays for the read and the parse. This bench measures that part
alone, with the controller's own reader (:class:`~monarch_ft.records.reports.ReportTail`) on real
files: ``--files`` files, each given one step record per round (the fake launcher's record, as
``benchmarks/scale_bench.py --controller-only`` writes it), then read by one tail per file:

- ``idle``: a read of every file when none grew (what a tick that reads nothing pays);
- ``read``: the new lines read and split, not parsed (``os.read`` on each file);
- ``parse``: the same read, each line decoded as JSON (``ReportTail.read_lines``);
- ``typed``: as the tick reads them, each a typed record (``ReportTail.read_records``).

Each is the median over ``--rounds`` rounds of the CPU time of one pass over every file, per record,
with the 2.5th-97.5th percentile of the rounds. The closing line sets them against the tick's
budget: ``--target-ms`` (the 1,024-group p50 target, 10 ms) over one record per file, what a tick
that reads one step of every group has per record for everything (reading, parsing and taking each
in). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.members import members_field  # noqa: E402
from monarch_ft.records.reports import ReportTail, _read_on  # noqa: E402
from monarch_ft.records.stats import percentile  # noqa: E402

STAGES = ("idle", "read", "parse", "typed")


def step_line(group: int, groups: int, step: int) -> bytes:
    """One step record as the fake launcher's rank writes it (``monarch_ft.testing.fakes.FakeRank.commit``)."""
    record = {
        "type": "step",
        "group": group,
        "rank": 0,
        "attempt": 0,
        "pid": None,
        "time": 1_800_000_000.0 + 0.1 * step,
        "step": step,
        "committed": True,
        "quorum_id": 1,
        "participating_groups": members_field(range(groups)),
        "quorum_size": groups,
        "loss": round(10.0 / (1 + step), 4),
        "step_time_s": 0.1,
        "compute_s": 0.05,
        "xgroup_s": 0.05,
        "state_hash": None,
        "fingerprint": {"step": step + 1, "digest": "0" * 15 + "0", "tensors": "0000000000000000", "vetoed": False},
    }
    return (json.dumps(record) + "\n").encode()


def _raw_read(tail: ReportTail) -> list[bytes]:
    """The read and split of :meth:`ReportTail.read_lines` (its own read, ``_read_on``), without the
    parse (this bench's own tails only: it reaches into the tail's file to leave the parse out)."""
    f = tail._f
    if f is None:
        f = tail._f = open(tail.path, "rb", buffering=0)
    chunk = _read_on(f.fileno())
    tail._offset += len(chunk)
    return chunk.split(b"\n")[:-1] if chunk else []


READS: dict[str, Callable[[ReportTail], list]] = {
    "idle": ReportTail.read_lines,
    "read": _raw_read,
    "parse": ReportTail.read_lines,
    "typed": ReportTail.read_records,
}


def measure(files: int, rounds: int) -> dict[str, list[float]]:
    """Per stage, the CPU seconds per record of each round (``idle``: per file)."""
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    with tempfile.TemporaryDirectory(prefix="report_floor.") as d:
        paths = [os.path.join(d, f"rank{i}.jsonl") for i in range(files)]
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for p in paths]
        tails = [ReportTail(p) for p in paths]
        try:
            step = 0
            for _ in range(rounds):
                for stage in STAGES:
                    if stage != "idle":
                        for g, fd in enumerate(fds):
                            os.write(fd, step_line(g, files, step))
                        step += 1
                    read = READS[stage]
                    t0 = time.process_time()
                    got = sum(len(read(t)) for t in tails)
                    spent = time.process_time() - t0
                    if got != (0 if stage == "idle" else files):
                        raise RuntimeError(f"{stage}: read {got} records from {files} files")
                    out[stage].append(spent / files)
        finally:
            for fd in fds:
                os.close(fd)
            for t in tails:
                t.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1024, help="rank report files (one record each per round)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--target-ms", type=float, default=10.0, help="the tick's CPU target for one step of every group")
    args = ap.parse_args(argv)
    if args.files < 1 or args.rounds < 1:
        print("report_floor: --files and --rounds must be at least 1", file=sys.stderr)
        return 2
    got = measure(args.files, args.rounds)
    print(f"{args.files} files, {args.rounds} rounds (CPU per record, median [2.5th, 97.5th percentile] of the rounds):")
    us = {}
    for stage in STAGES:
        v = [x * 1e6 for x in got[stage]]
        us[stage] = percentile(v, 50)
        print(f"  {stage:6s} {us[stage]:7.2f} us  [{percentile(v, 2.5):.2f}, {percentile(v, 97.5):.2f}]" + ("  (per file)" if stage == "idle" else ""))
    budget = args.target_ms * 1e3 / args.files
    print(
        f"read_us={us['read']:.2f} parse_us={us['parse']:.2f} typed_us={us['typed']:.2f} idle_us_per_file={us['idle']:.2f} "
        f"budget_us={budget:.2f} typed_share_of_budget={us['typed'] / budget:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
