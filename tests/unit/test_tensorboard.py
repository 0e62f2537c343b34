"""metrics.tensorboard: a group's curves and fault markers, written from its rank 0's records."""

from __future__ import annotations

import json

from monarch_ft.config.metrics import MetricsConfig
from monarch_ft.rank.components.metrics import RankReporter, build_metric_sinks
from monarch_ft.rank.components.tensorboard import Marker, MarkerTracker, TensorBoardSink, restart_cause
from monarch_ft.records.layout import RunLayout, read_jsonl
from monarch_ft.testing.jobs import read_tensorboard_run as read_run


def _step(step, members=(0, 1), committed=True, **extra):
    return {
        "type": "step",
        "step": step,
        "committed": committed,
        "participating_groups": list(members),
        "quorum_size": len(members),
        "loss": 5.0 - step / 10,
        "lr": 1e-3,
        "tokens_per_s": 900.0,
        "step_time_s": 0.2,
        "time": 1000.0 + step,
        **extra,
    }


def test_survivor_marks_the_quorum_change_and_failed_commit():
    t = MarkerTracker(attempt=0)
    assert t.see(_step(1)) == [] and t.see(_step(2)) == []
    assert t.see({"type": "liveness", "phase": "compute"}) == [] and t.see({"type": "heartbeat", "step": 2}) == []
    assert t.see(_step(3, members=(0, 1), committed=False)) == [(Marker.COMMIT_FAILED, 3, "step 3 not committed (quorum of 2)")]
    assert t.see(_step(3, members=(0,))) == [(Marker.QUORUM_CHANGE, 3, "groups [0, 1] -> [0] (left [1])")]
    assert t.see(_step(4, members=(0,))) == []
    assert t.see(_step(9, members=(0, 1))) == [(Marker.QUORUM_CHANGE, 9, "groups [0] -> [0, 1] (joined [1])")]
    # localsgd/diloco inner steps are no syncs: no quorum, nothing to commit.
    assert t.see(_step(10, members=(), committed=False, sync=False)) == []


def test_relaunched_group_marks_its_restart_where_it_rejoins_then_the_heal():
    t = MarkerTracker(attempt=1, restart_text="group_failed reason=exit rank=1 signal=SIGKILL")
    # model_ready reports the fresh model's step 0: not where the group comes back.
    assert t.see({"type": "event", "event": "model_ready", "step": 0}) == []
    marks = t.see({"type": "event", "event": "weights_recovered", "step": 14, "src_replica_rank": 0, "bytes": 2_500_000, "seconds": 0.04})
    assert marks == [
        (Marker.RESTART, 14, "attempt 1: group_failed reason=exit rank=1 signal=SIGKILL"),
        (Marker.HEAL, 14, "weights from replica rank 0: 2.5 MB in 0.04 s"),
    ]
    assert t.see(_step(14)) == [], "the restart is marked once"
    fault = t.see({"type": "event", "event": "collective_fault_injected", "mode": "abort", "rank": 0})
    assert fault == [(Marker.FAULT, 14, "collective_fault_injected mode=abort rank=0")]


def test_restart_cause_is_the_supervisors_last_word_on_the_group():
    events = [
        {"event": "group_failed", "group": 1, "attempt": 0, "reason": "exit", "rank": 1, "signal": "SIGKILL", "time": 1.0},
        {"event": "group_failed", "group": 0, "attempt": 0, "reason": "hung", "rank": 0, "stacks": {"g0r0": "x"}, "time": 2.0},
        {"event": "group_failed", "group": 1, "attempt": 1, "reason": "hung", "rank": 0, "silent_s": 15.2, "time": 3.0},
    ]
    assert restart_cause(events, 1, 1) == "group_failed reason=exit rank=1 signal=SIGKILL"
    assert restart_cause(events, 1, 2) == "group_failed reason=hung rank=0 silent_s=15.2"
    full = {"event": "full_restart", "resume_step": 10, "reason": "stall", "time": 4.0}
    assert restart_cause(events + [full], 0, 1) == "full_restart resume_step=10 reason=stall"
    assert restart_cause([], 1, 1) == "cause not in events.jsonl"


def test_sink_writes_curves_and_markers_tensorboard_reads_back(tmp_path):
    layout = RunLayout(str(tmp_path))
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "group_failed", "group": 1, "attempt": 0, "reason": "exit", "rank": 0, "code": -9}) + "\n")
    first = TensorBoardSink(layout, 1, 0)
    for s in range(5):
        first.record(_step(s))
    first.close()
    again = TensorBoardSink(layout, 1, 1)  # the relaunched attempt: a second file in the same run
    again.record({"type": "event", "event": "weights_recovered", "step": 8, "src_replica_rank": 0, "bytes": 10, "seconds": 0.1, "time": 1010.0})
    for s in range(8, 10):
        again.record(_step(s, quorum_s=0.01, compute_s=0.25))
    again.close()
    scalars, texts = read_run(layout.tensorboard(1))
    assert [s for s, _ in scalars["train/loss"]] == [0, 1, 2, 3, 4, 8, 9]
    assert scalars["train/loss"][1] == (1, 4.900000095367432)
    for tag in ("train/lr", "train/tokens_per_s", "train/step_time_s", "ft/quorum_size", "ft/participating_groups"):
        assert len(scalars[tag]) == 7, tag
    assert scalars["ft/quorum_s"] == [(8, 0.009999999776482582), (9, 0.009999999776482582)]
    assert scalars["ft/compute_s"] == [(8, 0.25), (9, 0.25)]  # the group's own compute: a straggler's stands out
    assert scalars["faults/restart"] == [(8, 1.0)] and scalars["faults/heal"] == [(8, 1.0)]
    assert texts == [
        (8, "step 8: **restart** attempt 1: group_failed reason=exit rank=0 code=-9"),
        (8, "step 8: **heal** weights from replica rank 0: 0.0 MB in 0.10 s"),
    ]


def test_only_rank_0_writes_and_a_broken_sink_never_stops_the_report(tmp_path, capsys):
    layout = RunLayout(str(tmp_path))
    on = MetricsConfig(tensorboard=True)
    assert build_metric_sinks(MetricsConfig(), layout, 0, 0, 0) == []
    assert build_metric_sinks(on, layout, 0, 1, 0) == []

    class Broken:
        closed = False

        def record(self, record):
            raise OSError("disk full")

        def close(self):
            Broken.closed = True

    sinks = build_metric_sinks(on, layout, 0, 0, 0) + [Broken()]
    reporter = RankReporter(layout.report(0, 0, 0), 0, 0, 0, sinks)
    reporter.step(**{k: v for k, v in _step(0).items() if k != "type"})
    reporter.step(**{k: v for k, v in _step(1).items() if k != "type"})
    reporter.close()
    assert [r["step"] for r in read_jsonl(layout.report(0, 0, 0))] == [0, 1]
    assert "metrics sink Broken turned off: OSError: disk full" in capsys.readouterr().err
    assert not Broken.closed, "a sink turned off is not called again"
    scalars, _ = read_run(layout.tensorboard(0))
    assert [s for s, _ in scalars["train/loss"]] == [0, 1]
