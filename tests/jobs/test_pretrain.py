"""End-to-end: real supervisor, real Lighthouse, real rank processes, real signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import numpy as np
import psutil
import pytest

from monarch_ft.controller.loop import request_finish
from monarch_ft.testing.jobs import FAST, NO_STANDBY, console, finish_job, read_jsonl, read_tensorboard_run, run_job, start_job, wait_for
from monarch_ft.testing.user_data import documents, make_tokenizer, write_parquet

pytestmark = pytest.mark.slow


def _steps(metrics, group):
    return [m for m in metrics if m["group"] == group and m["rank"] == 0 and m["committed"]]


def test_sigkilled_rank_group_restarts_and_heals_from_peer(run_dir):
    proc = start_job(run_dir, *FAST, "ft.replica_groups=2", "ft.ranks_per_group=2", "training.steps=100000", "metrics.tensorboard=true")
    metrics_path, events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    wait_for(lambda: len(_steps(read_jsonl(metrics_path), 1)) >= 5, 120, "group 1 to step")
    # The default path: the warm standby (built while the job trains) takes the group's place.
    wait_for(lambda: [e for e in read_jsonl(events_path) if e["event"] == "standby_ready"], 120, "the warm standby")
    victim = [e for e in read_jsonl(events_path) if e["event"] == "rank_launched" and e["group"] == 1 and e["rank"] == 1][-1]
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    # However long the restart takes on a loaded machine, the job runs until the group
    # is back; then it is asked to finish 20 steps on.
    back = lambda: [e for e in read_jsonl(events_path) if e["event"] == "quorum_change" and e["participating_groups"] == [0, 1] and e["time"] > killed_at]
    wait_for(back, 180, "group 1 to rejoin the quorum")
    request_finish(str(run_dir), max(m["step"] for m in _steps(read_jsonl(metrics_path), 0)) + 20)
    code = finish_job(proc, run_dir, 240)
    assert code == 0, console(run_dir)[-3000:]

    events = read_jsonl(events_path)
    metrics = read_jsonl(metrics_path)
    exited = [e for e in events if e["event"] == "rank_exited" and e["group"] == 1 and e.get("signal") == "SIGKILL"]
    assert exited and exited[0]["rank"] == 1
    kill_time = exited[0]["time"]
    assert any(e["event"] == "group_failed" and e["group"] == 1 for e in events)
    relaunch = [e for e in events if e["event"] == "group_launched" and e["group"] == 1 and e["attempt"] == 1]
    assert relaunch, "group 1 was not relaunched"
    healed = [e for e in events if e["event"] == "weights_recovered" and e["group"] == 1 and e["attempt"] == 1]
    assert {e["rank"] for e in healed} == {0, 1}, "both ranks of the new group heal from a peer"
    assert all(e["src_group"] == 0 and e["bytes"] > 0 for e in healed)
    assert all(e["src"].startswith("mft1://") for e in healed), "the default transport is ShardedTransport"
    rejoin = [e for e in events if e["event"] == "quorum_change" and e["participating_groups"] == [0, 1] and e["time"] > kill_time]
    assert rejoin, "the restarted group never rejoined the quorum"

    # Survivors never stopped: group 0 was never restarted and committed steps while
    # group 1 was down, with no step number going back.
    assert not any(e["event"] == "group_launched" and e["group"] == 0 and e["attempt"] > 0 for e in events)
    g0 = _steps(metrics, 0)
    steps = [m["step"] for m in g0]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    during = [m for m in g0 if kill_time < m["time"] < rejoin[0]["time"]]
    # A promoted standby is back within a second or two, so the window holds a step or a few.
    assert len(during) >= 1, "survivors did not keep stepping during the recovery"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["weights_consistent"] is True
    assert summary["groups"]["1"]["restarts"] == 1

    # The job as a whole, across the fault: every group and rank reported every field, and
    # together they committed every step once up to the step both groups finished at.
    assert summary["status"] == "completed" and set(summary["groups"]) == {"0", "1"}
    for field in ("group", "rank", "step", "loss", "tokens_per_s", "quorum_size", "participating_groups", "time"):
        assert all(field in m for m in metrics), field
    assert {(0, 0), (0, 1), (1, 0), (1, 1)} <= {(m["group"], m["rank"]) for m in metrics}
    final = summary["groups"]["0"]["final_step"]
    assert summary["groups"]["1"]["final_step"] == final == summary["job_step"], summary["groups"]
    committed = sorted({m["step"] for m in metrics if m["committed"]})
    assert committed == list(range(committed[0], final)) and committed[0] <= 1
    # Loss falls: the mean of the last steps is below the mean of the first ones.
    losses = [m["loss"] for m in sorted(metrics, key=lambda m: m["step"]) if m["committed"]]
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6 - 0.3, losses
    # Every replica ends bit-identical: one rank_finished per group and rank (the relaunched
    # group's from its new ranks), one state hash per rank index, equal across groups.
    finished = [e for e in events if e["event"] == "rank_finished"]
    assert sorted((e["group"], e["rank"]) for e in finished) == [(0, 0), (0, 1), (1, 0), (1, 1)], finished
    for r in (0, 1):
        assert len({e["state_hash"] for e in finished if e["rank"] == r}) == 1
    kinds = [e["event"] for e in events]
    every = ("job_started", "lighthouse_started", "group_launched", "rank_launched", "quorum_change", "group_finished", "lighthouse_stopped", "job_finished")
    for kind in every:
        assert kind in kinds, kind
    assert kinds.count("group_finished") == 2
    assert all(isinstance(e["time"], float) for e in events)

    # metrics.tensorboard: one run per group, read back as TensorBoard reads it. The survivor's
    # curve is every step its rank 0 reported, with the group's departure and return marked;
    # the relaunched group's run marks its restart (and why) and its heal where it rejoined.
    s0, text0 = read_tensorboard_run(run_dir / "tensorboard" / "group_0")
    reported = [m["step"] for m in metrics if m["group"] == 0 and m["rank"] == 0 and m["loss"] is not None]
    assert [s for s, _ in s0["train/loss"]] == reported
    assert len(s0["train/lr"]) == len(s0["ft/quorum_size"]) == len(reported)
    changes = [t for _, t in text0 if "**quorum_change**" in t]
    assert any("(left [1])" in t for t in changes) and any("(joined [1])" in t for t in changes), text0
    s1, text1 = read_tensorboard_run(run_dir / "tensorboard" / "group_1")
    back_at = min(e["step"] for e in healed)
    assert s1["faults/restart"] == [(back_at, 1.0)] and (back_at, 1.0) in s1["faults/heal"]
    assert any(t.startswith(f"step {back_at}: **restart** attempt 1: group_failed reason=exit rank=1") and "SIGKILL" in t for _, t in text1), text1
    assert {s for s, _ in s1["train/loss"]} >= {m["step"] for m in metrics if m["group"] == 1 and m["rank"] == 0 and m["attempt"] == 1}


def test_sigterm_to_supervisor_stops_everything(run_dir):
    proc = start_job(run_dir, *FAST, "ft.replica_groups=2", "ft.ranks_per_group=1", "training.steps=100000")
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 4, 120, "training to start")
    events = read_jsonl(run_dir / "events.jsonl")
    pids = [e["pid"] for e in events if e["event"] in ("rank_launched", "lighthouse_started")]
    port = int([e for e in events if e["event"] == "lighthouse_started"][0]["address"].rsplit(":", 1)[1])
    proc.send_signal(signal.SIGTERM)
    assert finish_job(proc, run_dir, 30) == 143
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    from monarch_ft.common.net import port_in_use

    assert not port_in_use("127.0.0.1", port), "the Lighthouse port is still held"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert read_jsonl(run_dir / "events.jsonl")[-1]["event"] == "job_finished"


@pytest.mark.parametrize("mode", ["hsdp", "diloco"])
def test_a_finish_asked_behind_the_job_ends_every_group_on_one_saved_step(run_dir, mode):
    """A finish that lands behind the groups (a writer's view of the job lags it) is agreed in
    the groups' next step, or sync (rank.trainer.StopAt): every group ends on one step past it,
    both in its quorum, saved there, with one weights hash; none trains a step alone (CI at
    a1c0f44), and no diloco window is cut short."""
    window = {"hsdp": [], "diloco": ["ft.mode=diloco", "ft.sync_every=5"]}[mode]
    proc = start_job(run_dir, *FAST, NO_STANDBY, *window, "ft.replica_groups=2", "ft.ranks_per_group=1", "training.steps=100000", "checkpoint.interval=10")
    commits = lambda: [m for m in read_jsonl(run_dir / "metrics.jsonl") if m["rank"] == 0 and m.get("committed")]
    wait_for(lambda: len([m for m in commits() if m["step"] >= 19]) >= 2, 120, "both groups to commit step 19")
    asked = request_finish(str(run_dir), 3)
    assert asked == 3 and finish_job(proc, run_dir, 120) == 0, console(run_dir)[-4000:]
    last = {g: [m for m in commits() if m["group"] == g][-1] for g in (0, 1)}
    assert last[0]["step"] == last[1]["step"] >= 19, last
    assert all(sorted(m["participating_groups"]) == [0, 1] for m in last.values()), last
    end = last[0]["step"] + 1
    assert end % (5 if mode == "diloco" else 1) == 0, "a diloco group ends on a sync point"
    events = read_jsonl(run_dir / "events.jsonl")
    finished = {e["group"]: e for e in events if e["event"] == "rank_finished"}
    assert {g: (e["step"], e["steps_trained"]) for g, e in finished.items()} == {0: (end, end), 1: (end, end)}
    assert finished[0]["state_hash"] == finished[1]["state_hash"]
    saved = {e["group"] for e in events if e["event"] == "checkpoint_saved" and e["step"] == end}
    assert saved == {0, 1}, "the step the groups ended on is saved as the last"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["weights_consistent"] is True and summary["step_regressions"] == []


def test_resume_from_disk_checkpoint_matches_the_uninterrupted_run(run_dir):
    """A job resumed from a disk checkpoint takes the very steps an uninterrupted one takes: DiLoCo,
    whose outer optimizer's momentum the checkpoint must hold beside the model and the inner
    optimizer (without it the resumed run's next outer step differs). One job runs to the end,
    saving every sync; its newest checkpoint is removed and a second job resumes from the one
    before: at the next sync its state hash (global copy and outer momentum) is the first's."""
    # Trained on a pre-tokenised file of the user's (data.path, a .npy of int32 ids) rather than the stdlib corpus.
    tokens = run_dir.parent / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, 2048, 20_000).astype(np.int32))
    # Two short jobs that end before a standby could be built, let alone serve: none.
    common = [*FAST, NO_STANDBY, "ft.replica_groups=1", "ft.ranks_per_group=2", "ft.mode=diloco", "ft.sync_every=3"]
    common += ["checkpoint.interval=3", "checkpoint.keep_latest_k=0", "training.steps=9", "training.state_hash_every=1", f"data.path={tokens}"]
    assert run_job(run_dir, *common) == 0, console(run_dir)[-3000:]
    assert {p.name for p in (run_dir / "checkpoint" / "group_0").iterdir()} >= {"step-3", "step-6", "step-9"}
    first = read_jsonl(run_dir / "metrics.jsonl")
    shutil.rmtree(run_dir / "checkpoint" / "group_0" / "step-9")
    assert run_job(run_dir, *common, "checkpoint.resume=true") == 0, console(run_dir)[-3000:]
    resumed = read_jsonl(run_dir / "metrics.jsonl")[len(first) :]
    assert min(m["step"] for m in resumed) == 6 and max(m["step"] for m in resumed) == 8
    assert any(e["event"] == "checkpoint_loaded" and e["step"] == 6 for e in read_jsonl(run_dir / "events.jsonl"))
    hashes = lambda records: {(m["step"], m["rank"]): m["state_hash"] for m in records if m["committed"] and m.get("state_hash")}
    at_sync = {k: v for k, v in hashes(first).items() if k[0] == 8}
    assert len(at_sync) == 2 and hashes(resumed) == at_sync, (hashes(resumed), at_sync)
    ready = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "data_ready"]
    assert [(e["path"], e["tokens"]) for e in ready] == [(str(tokens), 20_000)] * 2
    # The ranks read the file itself (read as the stdlib cache's raw uint16, its int32 ids and
    # header would index past the embedding and fail every step).
    assert json.loads((run_dir / "ranks" / "g0r1.a0.spec.json").read_text())["tokens_path"] == str(tokens)


@pytest.mark.parametrize("transport", ["http"])
def test_torchft_transports_heal_a_killed_group(run_dir, transport):
    # The relaunch path (a warm fork) with TorchFT's transport: the standby path is the test above.
    # The job is a user's own: their Hugging Face tokenizer and a parquet file of their documents
    # (made here, monarch_ft.testing.user_data), trained in bf16 (FSDP's policy on a one-rank
    # group) with TorchTitan's selective activation checkpointing; the heal moves that state.
    docs = documents(400)
    tokenizer = make_tokenizer(run_dir.parent / "tok", docs)
    parquet = write_parquet(run_dir.parent / "train.parquet", docs)
    user = [f"data.tokenizer={tokenizer}", f"data.path={parquet}", "training.mixed_precision=bf16", "training.activation_checkpoint=selective"]
    proc = start_job(run_dir, *FAST, NO_STANDBY, "ft.replica_groups=2", "ft.ranks_per_group=1", "training.steps=100000", f"ft.transport={transport}", *user)
    metrics_path = run_dir / "metrics.jsonl"
    wait_for(lambda: len(_steps(read_jsonl(metrics_path), 1)) >= 5, 120, "group 1 to step")
    victim = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "rank_launched" and e["group"] == 1][-1]
    os.kill(victim["pid"], signal.SIGKILL)
    # Once the relaunched group commits with its peer, the job finishes 5 steps on.
    back = lambda: [m for m in _steps(read_jsonl(metrics_path), 1) if m["attempt"] >= 1 and m["participating_groups"] == [0, 1]]
    wait_for(back, 180, "group 1 back in the quorum")
    request_finish(str(run_dir), max(m["step"] for m in _steps(read_jsonl(metrics_path), 0)) + 5)
    assert finish_job(proc, run_dir, 240) == 0, console(run_dir)[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    healed = [e for e in events if e["event"] == "weights_recovered" and e["group"] == 1 and e["attempt"] == 1]
    assert healed and healed[0]["bytes"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transport"] == transport and summary["weights_consistent"] is True
    # The user's data: tokenised by their tokenizer (400 ids) into the cache, which the ranks read.
    ready = [e for e in events if e["event"] == "data_ready"]
    assert [(e["path"], e["vocab_size"]) for e in ready] == [(str(parquet), 400)]
    tokens_path = json.loads((run_dir / "ranks" / "g0r0.a0.spec.json").read_text())["tokens_path"]
    assert "/dataset-train-" in tokens_path and int(np.asarray(np.memmap(tokens_path, dtype="<u2", mode="r")).max()) < 400
    losses = [m["loss"] for m in _steps(read_jsonl(metrics_path), 0)]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]), "bf16 with checkpointing trains"
