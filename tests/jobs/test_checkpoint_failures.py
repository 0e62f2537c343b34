"""A checkpoint that fails to save or to load never ends a job (real jobs, files, mounts, signals).

- A 24 MB tmpfs as ``checkpoint.folder``: saves fail with ENOSPC, the job trains on to its
  last step with one console line about it, and counts the failures.
- The newest step damaged, then every rank killed: the job resumes from the older step
  (truncation and a same-size rewrite caught by the manifest; a shard the manifest vouches
  for that fails to load anyway), and the damaged copies are quarantined on disk.
- The drills' ``ckpt_corrupt`` rewrite on every group's newest step, every rank killed: the
  manifest's checksum catches one copy, the state fingerprint the other (its manifest rewritten).
- Every kept step damaged and every rank killed: one line, a non-zero exit, no crash loop.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from chaos.kinds.ckpt_corrupt import damage_step
from monarch_ft.controller.loop import request_finish
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.manifest import complete_steps, file_checksum, step_dir, verify_step, write_manifest
from monarch_ft.testing.jobs import FAST, NO_STANDBY, REPO, console, finish_job, read_jsonl, start_job, wait_for

pytestmark = pytest.mark.slow

CKPT = ["checkpoint.interval=5"]
# The tests that kill every rank to leave only the disk find the ranks by their launches
# (rank_launched): a standby promoted after the first kill has none, and it would be a live
# copy of the state the test means to lose.
NO_PEER = [*CKPT, NO_STANDBY]


def _finish_once_both_are_back(proc, run_dir, since: float) -> tuple[list[dict], dict]:
    """Both groups committing in one quorum after ``since``, then the job asked to finish 5 steps
    on: it ends completed, weights agreeing, no step going back; its events and summary."""
    commits = lambda: [m for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("committed")]
    together = lambda: [m for m in commits() if m["time"] > since and sorted(m.get("participating_groups") or []) == [0, 1]]
    wait_for(together, 240, "both groups back in one quorum")
    request_finish(str(run_dir), max(m["step"] for m in commits()) + 5)
    assert finish_job(proc, run_dir, 240) == 0, console(run_dir)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["weights_consistent"] is True and summary["step_regressions"] == []
    return read_jsonl(run_dir / "events.jsonl"), summary


def _rank_pids(events: list[dict], group: int) -> list[int]:
    launched = [e for e in events if e["event"] == "rank_launched" and e["group"] == group]
    newest = max(e["attempt"] for e in launched)
    return [e["pid"] for e in launched if e["attempt"] == newest]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _folders(run_dir, groups: int) -> list[str]:
    return [RunLayout(str(run_dir)).checkpoint(g) for g in range(groups)]


def _shards(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".distcp"))


def _truncate(path: str) -> None:
    for shard in _shards(path):
        os.truncate(shard, os.path.getsize(shard) // 2)


def _rewrite_same_size(shard: str) -> None:
    """Other bytes in the middle of the file, its size unchanged (what a checksum alone catches)."""
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        chunk = f.read(4096)
        f.seek(-len(chunk), os.SEEK_CUR)
        f.write(bytes(b ^ 0x5A for b in chunk))


def _reseal(path: str) -> None:
    """Make the manifest vouch for the files as they are now (it then passes, the load does not)."""
    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    for name, entry in manifest["files"].items():
        entry["size"], entry["xxh3_128"] = file_checksum(os.path.join(path, name))
    write_manifest(path, manifest)


def _stop_damage_kill(run_dir, groups: int, damage) -> tuple[float, int, int]:
    """Freeze every rank (a save in flight stays unfinished) at a moment when every group's
    newest complete step is the same one, damage it in every group (``damage(step_dir,
    group)``), then SIGKILL every rank: no peer holds the state. Returns (kill time, damaged
    step, newest older complete step)."""
    events = read_jsonl(run_dir / "events.jsonl")
    pids = [p for g in range(groups) for p in _rank_pids(events, g)]
    folders = _folders(run_dir, groups)
    for _ in range(100):
        _signal(pids, signal.SIGSTOP)
        newest = {max(complete_steps(f)) for f in folders}
        if len(newest) == 1:
            break
        _signal(pids, signal.SIGCONT)  # one group is between its save and the other's
        time.sleep(0.1)
    assert len(newest) == 1, "the groups' newest steps never agreed"
    newest = newest.pop()
    for g, folder in enumerate(folders):
        damage(step_dir(folder, newest), g)
    older = max(s for f in folders for s in complete_steps(f) if s < newest)
    killed_at = time.time()
    _signal(pids, signal.SIGKILL)
    return killed_at, newest, older


def _after(events: list[dict], kind: str, t: float) -> list[dict]:
    return [e for e in events if e["event"] == kind and e["time"] > t]


def test_a_full_checkpoint_disk_costs_no_training(run_dir, tmp_path):
    """The issue's command on a 24 MB tmpfs, shortened: every save from the third on fails."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    try:
        job = ["ft.replica_groups=2", "ft.ranks_per_group=2", "training.steps=40", *CKPT, "checkpoint.keep_latest_k=3", f"checkpoint.folder={disk}"]
        proc = start_job(run_dir, *FAST, *job)
        assert finish_job(proc, run_dir, 300) == 0, console(run_dir)[-4000:]
        out = console(run_dir)
        events = read_jsonl(run_dir / "events.jsonl")
        summary = json.loads((run_dir / "summary.json").read_text())
        # The job trained every step, once, with the same weights; nothing else failed.
        assert summary["status"] == "completed" and summary["weights_consistent"] is True, summary
        assert all(g["final_step"] == 40 and g["restarts"] == 0 for g in summary["groups"].values()), summary["groups"]
        assert not [e for e in events if e["event"] in ("group_failed", "job_rollback", "restart_scheduled")]
        assert all(e.get("exit_code") == 0 for e in events if e["event"] == "rank_exited")
        # Every failure counted, by the errno; the newest good checkpoint and its age kept.
        failed = [e for e in events if e["event"] == "checkpoint_save_failed"]
        ckpt = summary["checkpoint"]
        assert len(failed) >= 2 and ckpt["save_failures"] == len(failed) and ckpt["save_failures_by_errno"] == {"ENOSPC": len(failed)}
        assert all(e["removed_partial"] and e["path"].startswith(str(disk)) for e in failed)
        assert ckpt["newest_good"]["step"] < min(e["step"] for e in failed) and ckpt["newest_good"]["age_s"] > 0
        # One console line, with the reason and the fix; then a count, never the same line again.
        lines = [line for line in out.splitlines() if "checkpoint save failed" in line]
        assert len(lines) == 1 and "ENOSPC" in lines[0] and "checkpoint.folder=" in lines[0], lines
        assert "saves failed (" in out and "Traceback" not in out
        # On disk: the older steps, intact; nothing partial left.
        verify = subprocess.run([sys.executable, "-m", "monarch_ft", "verify", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0 and "incomplete" not in verify.stdout, verify.stdout + verify.stderr
        assert len(verify.stdout.splitlines()) == 2 * len(complete_steps(str(disk / "group_0"))) >= 4, verify.stdout
        status = subprocess.run([sys.executable, "-m", "monarch_ft", "status", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert f"{len(failed)} saves failed (" in status.stdout and "newest good step" in status.stdout, status.stdout
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_damaged_newest_checkpoint_falls_back_to_the_older_step(run_dir):
    """Twice, every rank killed with the newest step damaged: first truncated in both groups,
    then one shard rewritten at the same size in one group, and in the other truncated under a
    manifest rewritten to match (it passes verification and fails to load)."""
    groups = 2
    proc = start_job(run_dir, *FAST, f"ft.replica_groups={groups}", "ft.ranks_per_group=1", "training.steps=100000", *NO_PEER, "checkpoint.keep_latest_k=3")
    folders = _folders(run_dir, groups)
    both_at = lambda step: lambda: all(complete_steps(f) and max(complete_steps(f)) >= step for f in folders)
    wait_for(both_at(10), 180, "both groups to save step 10")

    # Round 1: truncated in both groups.
    killed1, damaged1, older1 = _stop_damage_kill(run_dir, groups, lambda path, g: _truncate(path))
    disk = lambda: [e for e in _after(read_jsonl(run_dir / "events.jsonl"), "state_source", killed1) if e["source"] == "disk"]
    assert wait_for(disk, 120, "a group resumed from disk")[0]["step"] == older1
    wait_for(both_at(damaged1 + 5), 180, "both groups to save past the damaged step again")

    # Round 2: group 0's copy fails only at the load; group 1's is caught by its checksum.
    def damage2(path, g):
        if g == 0:
            _truncate(path)
            _reseal(path)
        else:
            _rewrite_same_size(_shards(path)[-1])

    killed2, damaged2, older2 = _stop_damage_kill(run_dir, groups, damage2)
    events, summary = _finish_once_both_are_back(proc, run_dir, killed2)
    quarantined = [e for e in events if e["event"] == "checkpoint_quarantined"]
    # Round 1: both truncated copies caught before any load, and the job went back to the older step.
    round1 = [e for e in quarantined if killed1 < e["time"] < killed2]
    assert sorted(e["group"] for e in round1) == [0, 1] and all(e["step"] == damaged1 and "its manifest says" in e["problem"] for e in round1), round1
    assert not [e for e in events if e["event"] == "checkpoint_load_failed" and e["time"] < killed2]
    assert {e["step"] for e in _after(events, "checkpoint_loaded", killed1) if e["time"] < killed2} == {older1}
    # Round 2: the same-size rewrite caught by its checksum; the load that failed anyway is
    # quarantined too, and the job went back to the older step; those relaunches are not counted.
    round2 = _after(quarantined, "checkpoint_quarantined", killed2)
    assert any(e["group"] == 1 and e["step"] == damaged2 and "does not match its checksum" in e["problem"] for e in round2), round2
    load_failed = _after(events, "checkpoint_load_failed", killed2)
    assert load_failed and {e["step"] for e in load_failed} == {damaged2}, load_failed
    assert any(e["step"] == damaged2 and e["problem"].startswith("failed to load:") for e in round2), round2
    assert {e.get("exit_reason") for e in _after(events, "rank_exited", killed2) if e.get("exit_code")} <= {"checkpoint_load_failed", None}
    assert [e for e in _after(events, "restart_scheduled", killed2) if e.get("counted") is False]
    assert all(g["restarts"] == 2 for g in summary["groups"].values()), "a checkpoint that failed to load costs no restart"
    disk_after2 = [e for e in _after(events, "state_source", killed2) if e["source"] == "disk"]
    assert disk_after2 and disk_after2[-1]["step"] == older2 and {e["step"] for e in _after(events, "checkpoint_loaded", killed2)} <= {damaged2, older2}
    # Never from the initial weights; every rollback named.
    assert not [e for e in events if e["event"] == "state_source" and e["source"] == "init" and e["time"] > killed1]
    # (The decision for the copy that then failed to load is a rollback too: its steps are given up either way.)
    assert {older1, older2} <= {r["to_step"] for r in summary["rollbacks"]} <= {older1, damaged2, older2} and summary["rollbacks"][-1]["to_step"] == older2
    assert summary["checkpoint"]["quarantined"] and summary["checkpoint"]["load_failures"]
    # The quarantine is on disk, with its reason, out of TorchTitan's sight.
    reason = lambda folder, name: json.loads(open(os.path.join(folder, "quarantine", f"{name}.reason.json")).read())
    for folder in folders:
        why = reason(folder, f"step-{damaged1}")
        assert why["from"] == step_dir(folder, damaged1) and "its manifest says" in why["reason"]
    assert "does not match its checksum" in reason(folders[1], f"step-{damaged2}")["reason"]
    # Whichever group loaded the copy that fails first: its copy is aside, with why.
    pattern = rf"(step-{damaged2}(\.\d+)?)\.reason\.json"
    names = [(f, m.group(1)) for f in folders for n in os.listdir(os.path.join(f, "quarantine")) if (m := re.fullmatch(pattern, n))]
    assert any(reason(f, name)["reason"].startswith("failed to load:") for f, name in names), names
    assert "Traceback" not in console(run_dir)


def test_ckpt_corrupt_on_every_group_is_caught_by_the_manifest_and_the_fingerprint(run_dir):
    """The drills' ``ckpt_corrupt`` rewrite (other bytes, the same size and time) on every group's
    newest step, then every rank killed. Group 1's copy fails its checksum; group 0's manifest
    was rewritten to match the new bytes, so only its state fingerprint tells: the copy loads
    (torch.load checks no checksum) but is not the state the replicas agreed on. Neither is
    loaded for good; the job resumes from the older step, with the replicas' weights."""
    groups = 2
    proc = start_job(run_dir, *FAST, f"ft.replica_groups={groups}", "ft.ranks_per_group=1", "training.steps=100000", *CKPT, "checkpoint.keep_latest_k=3")
    folders = _folders(run_dir, groups)
    wait_for(lambda: all(complete_steps(f) and max(complete_steps(f)) >= 10 for f in folders), 180, "both groups to save step 10")
    rng = random.Random(0)

    def damage(path, g):
        damage_step(path, "rewrite", rng)
        if g == 0:
            _reseal(path)

    killed, damaged, older = _stop_damage_kill(run_dir, groups, damage)
    assert verify_step(step_dir(folders[0], damaged)) is None, "the resealed copy passes its manifest's checksums"
    events, summary = _finish_once_both_are_back(proc, run_dir, killed)
    quarantined = [e for e in _after(events, "checkpoint_quarantined", killed) if e["step"] == damaged]
    assert any(e["group"] == 1 and "does not match its checksum" in e["problem"] for e in quarantined), quarantined
    # Group 0's copy passed its manifest, so it was chosen and copied where group 1's had been set
    # aside; the rank that loaded it told by its fingerprint, and that copy went aside too.
    load_failed = _after(events, "checkpoint_load_failed", killed)
    assert load_failed and all("not the one its manifest vouches for" in e["error"] for e in load_failed), load_failed
    assert any(e["problem"].startswith("failed to load: StateMismatch") for e in quarantined), quarantined
    # Nothing loaded for good but the older step (the group that failed the load then healed from its peer).
    assert {e["step"] for e in _after(events, "checkpoint_loaded", killed)} == {older}
    assert [e for e in _after(events, "state_source", killed) if e["source"] == "disk"][-1]["step"] == older
    assert "Traceback" not in console(run_dir)


def test_every_kept_step_damaged_stops_with_one_line_and_no_crash_loop(run_dir):
    groups = 2
    proc = start_job(run_dir, *FAST, f"ft.replica_groups={groups}", "ft.ranks_per_group=1", "training.steps=100000", *NO_PEER, "checkpoint.keep_latest_k=2")
    folders = _folders(run_dir, groups)
    wait_for(lambda: all(len(complete_steps(f)) >= 2 for f in folders), 180, "both groups to keep two steps")
    events = read_jsonl(run_dir / "events.jsonl")
    pids = [p for g in range(groups) for p in _rank_pids(events, g)]
    _signal(pids, signal.SIGSTOP)
    damaged = sorted({s for f in folders for s in complete_steps(f)})
    for folder in folders:
        for step in complete_steps(folder):
            _truncate(step_dir(folder, step))
    killed_at = time.time()
    _signal(pids, signal.SIGKILL)
    code = finish_job(proc, run_dir, 120)  # a crash loop would run on past this bound
    out = console(run_dir)
    assert code != 0, (code, out[-3000:])
    errors = [line for line in out.splitlines() if line.startswith("monarch_ft: error:")]
    assert len(errors) == 1 and "no intact disk checkpoint is left" in errors[0], errors
    assert all(f"step {s} (" in errors[0] for s in damaged), (damaged, errors[0])
    events = read_jsonl(run_dir / "events.jsonl")
    # No crash loop: at most the one relaunch whose gate found nothing; never a start from step 0.
    relaunches = _after(events, "group_launched", killed_at)
    assert all(sum(1 for e in relaunches if e["group"] == g) <= 1 for g in range(groups)), relaunches
    assert not _after(events, "checkpoint_loaded", killed_at) and not [e for e in events if e["event"] == "state_source" and e["source"] == "init"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    for folder in folders:
        assert not complete_steps(folder) and sorted(os.listdir(os.path.join(folder, "quarantine"))), folder
