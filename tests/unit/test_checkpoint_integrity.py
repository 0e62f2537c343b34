"""A checkpoint that cannot be written or read never ends a job: the pure parts, on real files.

Manifests against truncation, a same-size rewrite and a missing file; the fallback choice;
quarantine out of TorchTitan's sight; a copy cut short by a full disk (a real tmpfs); the
storage's refusal told apart from other failures; the one line a stop prints; the counts
``status`` and ``summary.json`` show; ``python -m monarch_ft verify``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from monarch_ft.controller.checkpoints import CheckpointHealth, choose_resume_step, folder_write_problem, quarantine_step, recover_checkpoint
from monarch_ft.rank.components.checkpoint import seal_step, storage_error
from monarch_ft.records.decisions import JobStateLost, StateSource, decide_state_source, needs_disk
from monarch_ft.records.events import EventKind
from monarch_ft.records.manifest import complete_steps, verify_step, verify_step_cached
from monarch_ft.testing.jobs import REPO, config_refusal


def _save(folder, step, shards=(b"rank zero's shard" * 100, b"rank one's shard" * 100)):
    """A sealed step as a two-rank save leaves it: shards, .metadata, manifest (the real writer)."""
    d = folder / f"step-{step}"
    d.mkdir(parents=True)
    names = []
    for rank, payload in enumerate(shards):
        (d / f"__{rank}_0.distcp").write_bytes(payload)
        names.append(f"__{rank}_0.distcp")
    (d / ".metadata").write_bytes(b"dcp metadata")
    seal_step(str(d), step, SimpleNamespace(storage_data={i: SimpleNamespace(relative_path=n) for i, n in enumerate(names)}))
    return d


@pytest.fixture
def tmpfs(tmp_path):
    """A real, tiny tmpfs (tests run as root), unmounted afterwards."""
    mounts = []

    def mount(name, size="64k", ro=False):
        d = tmp_path / name
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if ro else ""), "tmpfs", str(d)], check=True)
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        subprocess.run(["umount", str(d)], check=True)


# ---------------------------------------------------------------- the manifest
def test_manifest_catches_truncation_a_same_size_rewrite_and_a_missing_file(tmp_path):
    step = _save(tmp_path, 10)
    assert verify_step(str(step)) is None
    manifest = json.loads((step / "manifest.json").read_text())
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"} and manifest["step"] == 10

    shard = step / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert verify_step(str(step)) == f"__1_0.distcp is {len(data) // 2} bytes, its manifest says {len(data)}"

    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, one byte other
    assert "__1_0.distcp does not match its checksum" in verify_step(str(step))

    shard.write_bytes(data)
    assert verify_step(str(step)) is None
    (step / ".metadata").unlink()
    assert verify_step(str(step)) == ".metadata is missing"

    (step / "manifest.json").unlink()
    assert "no manifest.json" in verify_step(str(step))
    assert complete_steps(str(tmp_path)) == set(), "a step without its manifest is not complete"


def test_a_verification_is_reused_only_while_no_file_changed(tmp_path):
    step = _save(tmp_path, 10)
    cache: dict = {}
    assert verify_step_cached(str(step), cache) is None
    (step / "__0_0.distcp").write_bytes(b"x" * len((step / "__0_0.distcp").read_bytes()))  # same size, new mtime
    assert "does not match its checksum" in verify_step_cached(str(step), cache)
    signature, _, problem = cache[str(step)]
    cache[str(step)] = (signature, 0.0, problem)  # too old to trust
    assert verify_step_cached(str(step), cache) == problem and cache[str(step)][1] > 0


# ---------------------------------------------------------------- the fallback choice
def test_fallback_choice_passes_over_steps_with_no_intact_copy():
    steps = {"g0": {140, 150}, "g1": {140, 150}}
    bad = {("g0", 150): "truncated", ("g1", 150): "truncated"}
    verify = lambda folder, step: bad.get((folder, step))
    choice = choose_resume_step(steps, verify)
    assert choice.step == 140 and choice.intact == ("g0", "g1")
    assert [(d.folder, d.step, d.problem) for d in choice.damaged] == [("g0", 150, "truncated"), ("g1", 150, "truncated")]

    # One group's copy damaged: the step stands (the other copy replaces it).
    bad = {("g1", 150): "rewritten"}
    choice = choose_resume_step(steps, verify)
    assert choice.step == 150 and choice.intact == ("g0",) and [d.folder for d in choice.damaged] == ["g1"]

    # Newer than the job's step (an older job's), or failed to load in this job: not chosen.
    assert choose_resume_step(steps, verify, at_most=149).step == 140
    assert choose_resume_step(steps, verify, exclude={150}).step == 140
    # Nothing intact: none, every damaged copy named; it never falls back to nothing quietly.
    nothing = choose_resume_step(steps, lambda f, s: "damaged")
    assert nothing.step is None and len(nothing.damaged) == 4


def test_damaged_copies_are_quarantined_out_of_torchtitans_sight_and_replaced(tmp_path):
    from torchtitan.components.checkpoint import CheckpointManager

    g0, g1 = tmp_path / "group_0", tmp_path / "group_1"
    for g in (g0, g1):
        _save(g, 140)
        _save(g, 150)
    for g in (g0, g1):
        (g / "step-150" / "__0_0.distcp").write_bytes(b"cut")  # newest step truncated in both groups
    _save(g0, 160)
    shard = g1 / "step-150"
    rec = recover_checkpoint([str(g0), str(g1)])
    assert rec.step == 160  # group 0's newest is intact: group 1 gets a copy
    assert (g1 / "step-160" / "manifest.json").exists() and shard.exists(), "older steps are not looked at once one is intact"

    rec = recover_checkpoint([str(g0), str(g1)], at_most=155)
    assert rec.step == 140 and rec.paths == {str(g0): str(g0 / "step-140"), str(g1): str(g1 / "step-140")}
    assert sorted(q["folder"] for q in rec.quarantined) == [str(g0), str(g1)]
    for g in (g0, g1):
        moved = g / "quarantine" / "step-150"
        assert moved.is_dir() and not (g / "step-150").exists(), "renamed aside, never deleted"
        why = json.loads((g / "quarantine" / "step-150.reason.json").read_text())
        assert why["from"] == str(g / "step-150") and "__0_0.distcp is 3 bytes" in why["reason"]
        # TorchTitan's own lookup (and its keep_latest_k purge, same pattern) does not see it.
        assert CheckpointManager._find_load_step(None, str(g)) in (140, 160)
        assert "quarantine" not in {n for n in os.listdir(g) if n.startswith("step-")}
    assert complete_steps(str(g1)) == {140, 160}

    # A second quarantine of the same step does not overwrite the first.
    _save(g0, 150)
    second = quarantine_step(str(g0 / "step-150"), "again", by="a test")
    assert second.endswith("step-150.2") and (g0 / "quarantine" / "step-150").is_dir()


def test_a_copy_cut_short_by_a_full_disk_leaves_nothing_and_the_group_reads_the_intact_copy(tmp_path, tmpfs):
    g0 = tmp_path / "group_0"
    _save(g0, 20, shards=(os.urandom(48 << 10), os.urandom(48 << 10)))
    full = tmpfs("full", size="64k") / "group_1"  # 96 KB of shards do not fit
    rec = recover_checkpoint([str(g0), str(full)])
    assert rec.step == 20 and rec.paths[str(full)] == str(g0 / "step-20")
    assert [c["folder"] for c in rec.copy_failures] == [str(full)] and "ENOSPC" in rec.copy_failures[0]["error"]
    assert os.listdir(full) == [], "no partial copy left behind"


# ---------------------------------------------------------------- failures told apart
def test_the_storages_refusal_is_told_apart_from_other_failures():
    from torch.distributed.checkpoint.api import CheckpointException

    enospc = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step-15/__1_0.distcp")
    assert storage_error(enospc) is enospc
    assert storage_error(CheckpointException("write", {1: (enospc, None)})) is enospc
    eio = OSError(errno.EIO, "Input/output error")
    assert storage_error(CheckpointException("write", {0: (eio, None), 1: (enospc, None)})) is eio
    assert storage_error(CheckpointException("write", {0: (ValueError("bug"), None), 1: (enospc, None)})) is None
    assert storage_error(RuntimeError("a peer is gone")) is None


def test_an_unwritable_folder_is_refused_before_launch(tmp_path, tmpfs):
    ro = tmpfs("ro", ro=True)
    assert "EROFS" in folder_write_problem(str(ro / "ckpt"))
    message = config_refusal(tmp_path, f"checkpoint.folder={ro}/ckpt")
    assert message.startswith(f"checkpoint.folder={ro}/ckpt: cannot write in") and "(EROFS)" in message and message.endswith("checkpoint.folder=")
    rw = tmpfs("rw")
    assert folder_write_problem(str(rw / "a" / "b")) is None
    assert os.listdir(rw) == [], "the probe leaves nothing behind"


def test_no_intact_step_stops_with_one_line_naming_each_and_never_restarts_from_zero():
    assert not needs_disk([1], 160) and not needs_disk([], 0) and needs_disk([], 160)
    tried = ["step 150 (group 0: __0_0.distcp is 3 bytes, its manifest says 4000)", "step 140 (group 1: failed to load: EOFError)"]
    with pytest.raises(JobStateLost) as e:
        decide_state_source([], 160, None, tried=tried)
    line = str(e.value)
    assert "\n" not in line and all(t in line for t in tried) and "quarantine/" in line
    assert decide_state_source([], 160, 140, tried=tried).source is StateSource.DISK


def test_health_counts_failed_saves_and_ages_the_newest_good_checkpoint():
    events = [
        {"event": EventKind.CHECKPOINT_SAVED, "time": 100.0, "group": 0, "rank": 0, "step": 10},
        {"event": EventKind.CHECKPOINT_SAVE_FAILED, "time": 110.0, "group": 1, "step": 15, "errno": "ENOSPC", "path": "/c", "error": "full"},
        {"event": EventKind.CHECKPOINT_SAVE_FAILED, "time": 120.0, "group": 0, "step": 20, "errno": "ENOSPC", "path": "/c", "error": "full"},
        {"event": EventKind.CHECKPOINT_LOAD_FAILED, "time": 130.0, "group": 0, "rank": 0, "attempt": 2, "step": 5, "error": "EOFError"},
        {"event": EventKind.CHECKPOINT_LOAD_FAILED, "time": 130.0, "group": 0, "rank": 1, "attempt": 2, "step": 5, "error": "EOFError"},
    ]
    health = CheckpointHealth.from_events(json.loads(json.dumps(events)))  # as read back from events.jsonl
    d = health.as_dict(now=145.0)
    assert d["save_failures"] == 2 and d["save_failures_by_errno"] == {"ENOSPC": 2} and d["last_save_failure"]["step"] == 20
    assert d["newest_good"] == {"step": 10, "group": 0, "time": 100.0, "age_s": 45.0}
    assert len(d["load_failures"]) == 1, "one per group attempt, not one per rank"
    assert health.describe(145.0) == "newest good step 10 (45s ago); 2 saves failed (2 ENOSPC); 1 loads failed"
    # A newer save whose copy is then quarantined is not good: the newest good one is the older.
    health.observe({"event": EventKind.CHECKPOINT_SAVED, "time": 140.0, "group": 0, "rank": 0, "step": 30})
    assert health.newest_good["step"] == 30
    health.observe({"event": EventKind.CHECKPOINT_QUARANTINED, "time": 141.0, "group": 0, "step": 30, "path": "/q", "problem": "truncated"})
    assert health.newest_good["step"] == 10 and health.describe(145.0).endswith("1 loads failed; 1 copies quarantined")
    # A step that failed to load is good in no group's copy (the job never chooses it again).
    health.observe({"event": EventKind.CHECKPOINT_SAVED, "time": 142.0, "group": 1, "rank": 0, "step": 10})
    health.observe({"event": EventKind.CHECKPOINT_LOAD_FAILED, "time": 143.0, "group": 1, "rank": 0, "attempt": 3, "step": 10, "error": "EOFError"})
    assert health.newest_good is None and health.describe(145.0).startswith("no good checkpoint")


# ---------------------------------------------------------------- python -m monarch_ft verify
def test_verify_names_every_step_and_exits_by_what_it_found(tmp_path):
    run = tmp_path / "run"
    ckpt = tmp_path / "elsewhere"  # checkpoint.folder outside the run: read from the job's config
    run.mkdir()
    (run / "controller.json").write_text(json.dumps({"config": {"checkpoint": {"folder": str(ckpt)}, "ft": {"replica_groups": 2}}}))
    for g in (0, 1):
        _save(ckpt / f"group_{g}", 10)
    (ckpt / "group_1" / "step-20").mkdir()  # a save that did not finish

    def verify(path):
        res = subprocess.run([sys.executable, "-m", "monarch_ft", "verify", str(path)], cwd=REPO, capture_output=True, text=True, timeout=60)
        return res.returncode, res.stdout.splitlines(), res.stderr

    code, lines, _ = verify(run)
    assert code == 0 and len(lines) == 3, lines
    assert lines[0].startswith("group 0 step-10: intact (3 files") and "incomplete" in lines[2]

    (ckpt / "group_1" / "step-10" / "__1_0.distcp").write_bytes(b"x")
    quarantine_step(str(_save(ckpt / "group_0", 30)), "failed to load: EOFError", by="a test")
    code, lines, _ = verify(run)
    assert code == 1 and any(line.startswith("group 1 step-10: DAMAGED: __1_0.distcp is 1 bytes, its manifest says") for line in lines), lines
    assert "group 0 quarantine/step-30: quarantined: failed to load: EOFError" in lines

    code, lines, err = verify(tmp_path / "nothing")
    assert code == 2 and err.startswith("monarch_ft: error:") and len(err.splitlines()) == 1
