"""ft.mode=hsdp|localsgd|diloco end to end: real supervisor, Lighthouse and rank processes.

Each mode trains with a falling loss and equal weights where they must be equal (localsgd 3
groups of 1 rank, diloco 2 of 2); each survives a SIGKILLed rank, the relaunched group heals in
step with its peers and its first sync counts each window once, the job trains every batch
exactly once across the fault (batch ids from the step records), and no step commits past the
finish.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from chaos.mttr import batch_accounting
from monarch_ft.controller.loop import request_finish
from monarch_ft.records.faults import request_slow_save
from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.jobs import FAST, console, finish_job, read_jsonl, start_job, wait_for

H = 10

MODES = {
    "hsdp": ["ft.mode=hsdp"],
    "localsgd": ["ft.mode=localsgd", f"ft.sync_every={H}"],
    "diloco": ["ft.mode=diloco", f"ft.sync_every={H}"],
}

WINDOW = {"hsdp": 1, "localsgd": H, "diloco": H}
# (groups, ranks per group): localsgd with three groups, where a healed group's first sync could
# count its donor's window twice (with two the average of a window and its copy is the window);
# diloco with two ranks per group, where the outer optimizer's state is sharded (FSDP2).
SHAPES = {"localsgd": (3, 1), "diloco": (2, 2)}


def _commits(metrics, group):
    return [m for m in metrics if m["group"] == group and m["rank"] == 0 and m["committed"]]


def assert_every_batch_once(metrics, final_step: int, window: int) -> dict:
    """Each kept window holds exactly its own batches, no group keeps a batch twice, and
    together the groups kept every batch of the job."""
    acc = batch_accounting(metrics)
    for group, step, batches in acc["windows"]:
        if batches:  # a group that healed into a sync trained nothing of that window
            assert batches == list(range(step - window + 1, step + 1)), (group, step, batches)
    for group, batches in acc["kept"].items():
        assert len(batches) == len(set(batches)), f"group {group} trained a batch twice: {batches}"
    union = set().union(*acc["kept"].values())
    assert union == set(range(final_step)), sorted(set(range(final_step)) ^ union)
    return acc


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["localsgd", "diloco"])  # hsdp: test_pretrain's 2x2 job and kill, the drills
def test_mode_trains_and_survives_process_kill_in_step_with_every_batch_once(run_dir, mode):
    """One job per mode: it trains with a falling loss, committing at sync points only, and
    survives a SIGKILLed rank mid-window (one job instead of two: the suite's time)."""
    w = WINDOW[mode]
    groups, ranks = SHAPES[mode]
    shape = (f"ft.replica_groups={groups}", f"ft.ranks_per_group={ranks}")
    proc = start_job(run_dir, *FAST, *MODES[mode], *shape, "training.steps=100000", "training.state_hash_every=1")
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    # Kill mid-window: after group 1's second sync and a few inner steps more. The default
    # path: the warm standby (built while the job trains) takes the group's place.
    wait_for(lambda: len(_commits(read_jsonl(metrics_path), 1)) >= (2 if w > 1 else 8), 150, "group 1 to sync")
    wait_for(lambda: [e for e in read_jsonl(events_path) if e["event"] == "standby_ready"], 120, "the warm standby")
    if w > 1:
        wait_for(lambda: max(m["step"] for m in read_jsonl(metrics_path) if m["group"] == 1) % w >= w // 2, 60, "mid-window")
    victim = [e for e in read_jsonl(events_path) if e["event"] == "rank_launched" and e["group"] == 1 and e["rank"] == ranks - 1][-1]
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    everyone = list(range(groups))
    back = lambda: [m for m in _commits(read_jsonl(metrics_path), 1) if m["attempt"] >= 1 and m["participating_groups"] == everyone]
    wait_for(back, 200, "group 1 to commit a sync with group 0 again")
    finish = max(m["step"] for m in _commits(read_jsonl(metrics_path), 0)) + 1 + 2 * w
    request_finish(str(run_dir), finish)
    code = finish_job(proc, run_dir, 240)
    assert code == 0, console(run_dir)[-3000:]

    metrics = read_jsonl(metrics_path)
    events = read_jsonl(events_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any(e["event"] == "group_failed" and e["group"] == 1 for e in events)
    assert any(e["event"] == "weights_recovered" and e["group"] == 1 and e["attempt"] >= 1 for e in events)
    final = summary["groups"]["0"]["final_step"]
    assert all(summary["groups"][str(g)]["final_step"] == final for g in everyone) and final % w == 0
    assert summary["weights_consistent"] is True
    # No step commits past the finish: groups done first held the job open, serving quorums
    # that commit nothing, and every rank ends at the finish.
    finished = [e for e in events if e["event"] == "rank_finished"]
    assert len(finished) == groups * ranks and all(e["step"] == final for e in finished), finished

    # Back in step: the relaunched group's first sync is the peer's (same step, same quorum),
    # it healed into it, and its next batch is exactly the one after that sync.
    rejoin = [m for m in _commits(metrics, 1) if m["attempt"] >= 1][0]
    peer = [m for m in _commits(metrics, 0) if m["step"] == rejoin["step"]]
    assert peer and peer[-1]["quorum_id"] == rejoin["quorum_id"], (rejoin, peer)
    after = sorted((m for m in metrics if m["group"] == 1 and m["rank"] == 0 and m["attempt"] >= 1 and m["time"] > rejoin["time"]), key=lambda m: m["time"])
    assert after and after[0]["batch"] == rejoin["step"] + 1, (rejoin, after[:2])
    if w > 1:
        assert rejoin["healed"] is True and rejoin["batch"] is None  # trained nothing before its heal
    # Its first sync counts each window once: the healed group (its window is its donor's copy)
    # sends zeros and is not counted, and on every rank the average is the sum the groups that
    # trained a window sent, over their number (what each rank sent and got: the records' sums).
    rejoin_sync = [m for m in metrics if m["committed"] and (m["step"], m["quorum_id"]) == (rejoin["step"], rejoin["quorum_id"])]
    for r in range(ranks):
        at_rank = {m["group"]: m for m in rejoin_sync if m["rank"] == r}
        counted = at_rank[1]["participating_groups"]
        assert 1 not in counted and at_rank[1]["sync_sent_sum"] == 0.0, at_rank[1]
        assert set(counted) == set(at_rank) - {1} and counted, (counted, sorted(at_rank))
        # A survivor missing from that sync was still in its failed one: gloo's ring tells only the
        # dead group's neighbours at once, the others wait out the collective's timeout, and the new
        # quorum formed without it (CI: group 2's failed sync took 1.2 s, group 0's 0.2 s). It
        # healed at the next sync it joined: nothing of it lost, it was not counted twice.
        for g in set(everyone) - set(at_rank):
            assert any(e["event"] == "weights_recovered" and e["group"] == g and e["time"] > rejoin["time"] for e in events), (g, counted)
        expected = sum(at_rank[g]["sync_sent_sum"] for g in counted) / len(counted)
        for m in at_rank.values():
            assert m["participating_groups"] == counted and m["quorum_size"] == len(counted)
            assert abs(m["sync_avg_sum"] - expected) <= 1e-5 * (1 + abs(expected)), (m, expected)

    # Weights agree at every sync both groups hashed, before the kill and after the rejoin: a
    # sync is a (step, quorum). A group that fell out of one (its heartbeat late on a loaded
    # machine: the peer synced alone) heals into the peers' next sync and commits it under its
    # own step (a redone step, as CI at 7e26fc4 saw): its state is the peer's in that quorum.
    hashes: dict[tuple[int, int, int], dict[int, str]] = {}
    redone: list[dict] = []
    for m in metrics:
        if m.get("state_hash") and m["committed"]:
            hashes.setdefault((m["step"], m["quorum_id"], m["rank"]), {})[m["group"]] = m["state_hash"]
            if m.get("healed") and m["attempt"] == 0:
                redone.append(m)
    common = {k: v for k, v in hashes.items() if len(v) >= 2}
    assert any(step >= rejoin["step"] for step, _, _ in common) and any(step < rejoin["step"] for step, _, _ in common), sorted(common)
    assert all(len(set(v.values())) == 1 for v in common.values()), common
    for m in redone:
        hashed = [p for p in metrics if p.get("state_hash") and p["committed"] and p["group"] != m["group"]]
        same_sync = [p for p in hashed if (p["quorum_id"], p["rank"]) == (m["quorum_id"], m["rank"])]
        peer = min(same_sync, key=lambda p: abs(p["time"] - m["time"]))
        assert m["state_hash"] == peer["state_hash"], (m, peer)

    # The mode ran as asked: every record is of it, commits only at sync points (every
    # window-th step), group 0 was in every sync up to group 1's return (the kill cost the
    # survivor nothing), and the loss fell. A later sync group 0 fell out of (its steps late on
    # a loaded machine: the peer synced alone, as beside two CPU hogs at 1afe25e) it healed
    # into, sending zeros, with the peer's state (the redone check above).
    assert {m["mode"] for m in metrics} == {mode}
    for g in everyone:
        assert all(m["step"] % w == w - 1 for m in _commits(metrics, g)), [m["step"] for m in _commits(metrics, g)]
    assert all(0 in m["participating_groups"] for m in _commits(metrics, 0) if m["step"] <= rejoin["step"])
    missed = [m for m in _commits(metrics, 0) if 0 not in m["participating_groups"]]
    assert all(m["healed"] and m["sync_sent_sum"] == 0.0 and m["step"] > rejoin["step"] for m in missed), missed
    losses = [m["loss"] for m in sorted(metrics, key=lambda m: m["step"]) if m["loss"] is not None]
    n = len(losses) // 5
    assert sum(losses[-n:]) / n < sum(losses[:n]) / n - 0.3, losses

    acc = assert_every_batch_once(metrics, final, w)
    # What the kill cost: the killed group's unsynced steps, at most one window (+1: the step in
    # flight). A sync the group fell out of before the kill (its heartbeat late on a loaded machine,
    # as CI at fc15933 saw: 10 + 9 steps) is not the kill's: its batches are kept by the peer, which
    # assert_every_batch_once has checked.
    lost = [x for x in acc["discarded"] if x["group"] == 1 and x["attempt"] == 0]
    by_kill = [x for x in lost if x["tail"] or x["time"] >= killed_at]
    assert sum(x["steps"] for x in by_kill) <= w + 1, (killed_at, lost)


@pytest.mark.slow
@pytest.mark.parametrize("killed", [False, True], ids=["slow", "killed"])
@pytest.mark.parametrize("mode", ["localsgd", "diloco"])
def test_a_group_that_misses_the_last_sync_heals_to_the_finish_and_no_holder_aborts(run_dir, mode, killed):
    """Group 0's save after a sync takes 8 s, and the finish is asked for while it saves, two
    windows on: its peers read it in the next window, agree it at the sync group 0 misses,
    reach the finish and hold the job open; group 0, which agreed no finish, comes to its sync,
    heals there to the finish, learns from the quorum's exchange that its peers hold, and
    serves that quorum as they do (MonarchManager.past_finish).

    Before, its sync's averages met the holders' one collective: gloo aborted a holder
    ("Received data size doesn't match expected size"), and its record of the sync read as a
    commit below the job's step (status regressed: a localsgd run at dff7bb5). The fix at
    7f8afd8 decided on the finish group 0 had agreed, which held only when the finish landed
    before its last sync: CI at abeb6af, localsgd, wrote it a moment later and every holder
    aborted. Asking for it during the save replays that order every run.

    ``killed``: group 0 is SIGKILLed in that save once its peers hold; relaunched, it joins
    them at their quorum (SemiSync._join), heals to the finish and serves it as they do, told
    so by the exchange, not by its own first read of the finish."""
    shape = ("ft.replica_groups=3", "ft.ranks_per_group=1", "ft.standby_groups=0", "ft.sync_every=5", "checkpoint.interval=5")
    proc = start_job(run_dir, *FAST, f"ft.mode={mode}", *shape, "training.steps=100000")
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    wait_for(lambda: len(_commits(read_jsonl(metrics_path), 0)) >= 3, 150, "group 0 to sync three times")
    # 8 s: the peers sync twice without group 0 meanwhile (a quorum that drops it waits for it first).
    request_slow_save(RunLayout(str(run_dir)), 0, 0, 8.0)
    wait_for(lambda: any(e["event"] == "slow_save_injected" for e in read_jsonl(events_path)), 60, "group 0's slow save")
    saving = [e["step"] for e in read_jsonl(events_path) if e["event"] == "checkpoint_save_started" and e["group"] == 0]
    finish = saving[-1] + 2 * 5
    request_finish(str(run_dir), finish)
    if killed:
        holding = lambda: {e["group"] for e in read_jsonl(events_path) if e["event"] == "train_done"} >= {1, 2}
        wait_for(holding, 60, "groups 1 and 2 to hold at the finish")
        victim = [e for e in read_jsonl(events_path) if e["event"] == "rank_launched" and e["group"] == 0][-1]
        os.kill(victim["pid"], signal.SIGKILL)
    assert finish_job(proc, run_dir, 240) == 0, console(run_dir)[-3000:]

    metrics, events = read_jsonl(metrics_path), read_jsonl(run_dir / "events.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    failed = [(e["group"], e["attempt"]) for e in events if e["event"] == "group_failed"]
    assert failed == ([(0, 0)] if killed else []), "no holder aborted"
    assert not [e for e in events if e["event"] == "step_regression"], "no commit went back"
    last_sync = {g: [m for m in _commits(metrics, g) if m["step"] == finish - 1] for g in range(3)}
    assert not last_sync[0] and all(m["participating_groups"] == [1, 2] for g in (1, 2) for m in last_sync[g]), last_sync
    assert all(last_sync[g] for g in (1, 2)), "the peers synced the last window without group 0"
    finished = [e for e in events if e["event"] == "rank_finished"]
    assert sorted(e["group"] for e in finished) == [0, 1, 2] and {e["step"] for e in finished} == {finish}, finished
    assert len({e["state_hash"] for e in finished}) == 1
    assert summary["status"] == "completed" and summary["weights_consistent"] is True and summary["step_regressions"] == []
