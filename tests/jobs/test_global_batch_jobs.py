"""ft.global_batch=constant end to end: real supervisor, Lighthouse and rank processes.

The assignment is unit-tested in tests/unit/test_global_batch.py; here a group is SIGKILLed and
stays out for tens of steps, and the records show that every committed step trained the
fault-free run's tokens and the fault-free run's samples, none twice, none skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from monarch_ft.controller.loop import request_finish
from monarch_ft.launcher.hosts import shaping_qdisc
from monarch_ft.records.global_batch import GlobalBatch, consumed, step_tokens
from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.jobs import FAST, NO_STANDBY, console, finish_job, need_netns, read_jsonl, start_job, wait_for

pytestmark = pytest.mark.slow

BATCH, SEQ = 2, 64  # FAST's
# 6 mbit: the tiny model's state (4.7 MB) takes about 6.5 s to send (within the collective's 10 s timeout).
SLOW_LINK = shaping_qdisc(0.0, "6mbit")  # the launcher's own slow_link qdisc


def _commits(metrics, group):
    return [m for m in metrics if m["group"] == group and m["rank"] == 0 and m["committed"]]


def test_constant_global_batch_trains_every_sample_once_through_a_fault(run_dir):
    # No standby, and a relaunch 2 s after the kill (then a warm fork and a heal): group 1 is out
    # for tens of steps.
    overrides = (*FAST, NO_STANDBY, "ft.restart_backoff_s=2", "ft.replica_groups=2", "ft.ranks_per_group=1", "training.steps=100000")
    proc = start_job(run_dir, *overrides)
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    wait_for(lambda: len(_commits(read_jsonl(metrics_path), 1)) >= 5, 120, "group 1 to step")
    victim = [e for e in read_jsonl(events_path) if e["event"] == "rank_launched" and e["group"] == 1][-1]
    os.kill(victim["pid"], signal.SIGKILL)
    back = lambda: [m for m in _commits(read_jsonl(metrics_path), 1) if m["attempt"] >= 1 and m["participating_groups"] == [0, 1]]
    wait_for(back, 180, "group 1 back in the step's sum")
    request_finish(str(run_dir), max(m["step"] for m in _commits(read_jsonl(metrics_path), 0)) + 10)
    code = finish_job(proc, run_dir, 240)
    assert code == 0, console(run_dir)[-3000:]

    metrics, events = read_jsonl(metrics_path), read_jsonl(events_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    final = summary["job_step"]
    assert summary["weights_consistent"] is True and summary["groups"]["1"]["restarts"] == 1

    # The fault: group 0 trained tens of steps alone, each with both groups' data.
    alone = [m for m in _commits(metrics, 0) if m["participating_groups"] == [0]]
    assert len(alone) >= 20, f"group 1 was out for {len(alone)} steps only"
    assert all(m["slots"] == [0, 1] for m in alone), alone[:3]
    # Group 1's heal: in the step it healed in it sent nothing and trained nothing; group 0 took its slot.
    healed = [m for m in _commits(metrics, 1) if m["attempt"] == 1][0]
    assert healed["slots"] == [] and 1 not in healed["participating_groups"], healed
    assert [m["slots"] for m in _commits(metrics, 0) if m["step"] == healed["step"]] == [[0, 1]]

    # Every committed step trained exactly the fault-free run's samples (slot s of step t is a pure
    # function of the seed, t, s and the rank: records.global_batch) and its tokens: 2 groups x 1
    # rank x 2 sequences x 64 tokens, what the steps before the fault recorded too. (In the step
    # the kill landed in, group 1's gradient may be in the sum with no record of it left.)
    assert consumed(metrics, 2, GlobalBatch.CONSTANT) == {t: [0, 1] for t in range(final)}
    per_step = step_tokens(2, 1, BATCH, SEQ)
    assert all(m["global_tokens"] == per_step for m in metrics if m["committed"]), {m["global_tokens"] for m in metrics if m["committed"]}
    assert {m["global_tokens"] for m in _commits(metrics, 1) if m["attempt"] == 0} == {per_step}

    # No step commits past the finish: the groups held the job open at the end (and group 0
    # while group 1 healed), serving quorums that commit nothing.
    finished = [e for e in events if e["event"] == "rank_finished"]
    assert sorted(e["group"] for e in finished) == [0, 1] and all(e["step"] == final for e in finished), finished


def test_a_group_waiting_out_a_peers_slow_heal_is_not_judged_hung(run_dir):
    """Under constant, the step a group heals in runs one collective (StepSlots.participants) that
    completes once the healing group has its state: every other group waits for the heal. Here
    group 2 is killed and its replacement heals from group 0 or 1, each sending over a link
    slowed to 6 mbit (about 6.5 s for the tiny model's state). The survivor that is not the source
    waited marked as compute, and a rank asleep in compute for a second is hung on a CPU: it was
    failed, then the source, and the job went back to its checkpoint (the straggler drill beside
    two CPU hogs, where each group that waited for a peer healing over a slow link failed in
    turn). That wait is the sync phase's now, within the sync budget.

    A batch of 128: each survivor's own slot then takes longer than the step's quorum, so the
    quorum is in when it reaches the collective, as beside the hogs (with FAST's batch of 2 the
    quorum, still configuring, was waited for first, in the sync phase, and hid the bug)."""
    need_netns()
    overrides = (*FAST, "launcher=local_hosts", "ft.replica_groups=3", "ft.ranks_per_group=1", "training.steps=100000", "training.batch_size=128")
    proc = start_job(run_dir, *overrides)
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    wait_for(lambda: len(_commits(read_jsonl(metrics_path), 2)) >= 5, 150, "group 2 to step")
    wait_for(lambda: [e for e in read_jsonl(events_path) if e["event"] == "standby_ready"], 150, "the warm standby")
    launched = {e["group"]: e for e in read_jsonl(events_path) if e["event"] == "rank_launched"}
    # The survivors' hosts (network namespaces): what each sends leaves through its eth0.
    shaped = [launched[g]["host"] for g in (0, 1)]
    for netns in shaped:
        subprocess.run(["tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", *SLOW_LINK], check=True)
    try:
        os.kill(launched[2]["pid"], signal.SIGKILL)
        # Its heal, or a survivor failed meanwhile (the bug: then no heal may ever end).
        ended = lambda: [
            e
            for e in read_jsonl(events_path)
            if (e["event"] == "weights_recovered" and e["group"] == 2 and e["attempt"] >= 1) or (e["event"] == "group_failed" and e["group"] != 2)
        ]
        wait_for(ended, 180, "group 2's replacement to heal")
    finally:
        for netns in shaped:
            subprocess.run(["tc", "-n", netns, "qdisc", "del", "dev", "eth0", "root"], check=False)
    request_finish(str(run_dir), max(m["step"] for m in _commits(read_jsonl(metrics_path), 0)) + 5)
    code = finish_job(proc, run_dir, 240)
    assert code == 0, console(run_dir)[-3000:]

    events = read_jsonl(events_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    failed = [e for e in events if e["event"] == "group_failed"]
    assert [e["group"] for e in failed] == [2], failed
    heal = [e for e in events if e["event"] == "weights_recovered" and e["group"] == 2 and e["attempt"] >= 1][0]
    # The heal was slow enough to matter: longer than the asleep rule's second, twice over.
    assert heal["seconds"] >= 2.0, heal
    assert not [e for e in events if e["event"] == "job_rollback"], "the job went back to its checkpoint"
    assert summary["status"] == "completed" and summary["weights_consistent"] is True
    # What the survivor that did not send told during the heal: its own slot's compute (seconds
    # on a loaded machine, at this batch), then the sync phase until the heal ended.
    waiter = ({0, 1} - {heal["src_group"]}).pop()
    started = heal["started"]
    beats = read_jsonl(RunLayout(str(run_dir)).report(waiter, 0, 0))
    during = [(round(r["time"] - started, 2), r["phase"]) for r in beats if r["type"] == "liveness" and started < r["time"] < started + heal["seconds"] - 0.5]
    first_sync = next((i for i, (_, phase) in enumerate(during) if phase == "sync"), None)
    assert first_sync is not None and {phase for _, phase in during[first_sync:]} == {"sync"}, during
