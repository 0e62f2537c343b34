"""The takeover state written incrementally (monarch_ft.records.journal, the RecordMirror of
monarch_ft.controller.snapshot, Takeover.save): a base and a journal replayed equal the whole
snapshot, a torn last line is ignored, compaction keeps the files bounded, a failed write
raises. Fast: the real watch loop on the fakes, real files."""

from __future__ import annotations

import errno
import json
import os
import socket

import numpy as np
import pytest

from monarch_ft.config.controller import ControllerConfig
from monarch_ft.controller.loop import Supervisor
from monarch_ft.controller.snapshot import from_record, to_record
from monarch_ft.controller.state import GroupState, JobState, LaunchRecord, RankState
from monarch_ft.controller import takeover as takeover_module
from monarch_ft.controller.takeover import PROGRESS_SAVE_MAX_S, PROGRESS_SAVE_S, Takeover
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.journal import JournalDamaged, StateJournal, StateReader, apply, diff, read_state
from monarch_ft.records.layout import RunLayout
from monarch_ft.testing.fakes import FakeClock, FakeLauncher, Script, fake_job_config

FILE_FIELDS = ("version", "finished", "controller_pid")


def whole(record: dict) -> dict:
    """A record as it reads back from JSON, less the file's own fields."""
    return {k: v for k, v in json.loads(json.dumps(record, default=str)).items() if k not in FILE_FIELDS}


@pytest.mark.parametrize("progress_save_s", [(0.0, 0.0), (PROGRESS_SAVE_S, PROGRESS_SAVE_MAX_S)])
def test_a_journal_replayed_equals_the_snapshot_at_every_save_of_a_job(tmp_path, monkeypatch, progress_save_s):
    """A fake job with a rank killed, a standby promoted, state hashes every step: after every
    save the base with its journal reads back as the whole snapshot, and restores a JobState
    equal to the live one; small compaction thresholds make it compact many times on the way.
    With a save every tick, and with the ticks that only took records in saved every
    PROGRESS_SAVE_S to PROGRESS_SAVE_MAX_S (then a save holds several ticks' changes)."""
    monkeypatch.setattr(takeover_module, "PROGRESS_SAVE_S", progress_save_s[0])
    monkeypatch.setattr(takeover_module, "PROGRESS_SAVE_MAX_S", progress_save_s[1])
    ticks = []
    real_tick = Supervisor.tick
    monkeypatch.setattr(Supervisor, "tick", lambda self, now: ticks.append(now) or real_tick(self, now))
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, (np.arange(4096) % 1000).astype(np.uint16))
    with socket.create_server(("127.0.0.1", 0)) as server:
        cfg = fake_job_config(str(tokens), f"127.0.0.1:{server.getsockname()[1]}", ft__replica_groups=3, training__steps=40)
        cfg.training.state_hash_every = 1
        clock = FakeClock()
        run_dir = str(tmp_path / "run")
        launcher = FakeLauncher(clock, run_dir, step_s=0.1)
        launcher.script(1, 0, Script(exit_at_step=15))
        sup = Supervisor(cfg, run_dir, launcher=launcher, echo=False, clock=clock, fork_server=launcher.fork_server)
        takeover = sup.takeover
        takeover.journal.compact_min_bytes = 1 << 10
        layout = RunLayout(run_dir)
        saves, partials = [], []
        real_save = takeover.save

        def save(state, finished=False, groups=None, partial=False):
            real_save(state, finished, groups, partial)
            on_disk = layout.read_controller_state()
            if partial:
                # A launch's save, of its group only: that group is on disk as it is now; the
                # pass's other changes go with the tick's own save.
                now = whole(takeover.snapshot(state, finished))
                assert all(whole(on_disk)["groups"][i] == now["groups"][i] for i in groups)
                partials.append(groups)
                return
            assert whole(on_disk) == whole(takeover.snapshot(state, finished))
            assert on_disk["finished"] is finished
            assert from_record(JobState, {k: v for k, v in on_disk.items() if k not in FILE_FIELDS}) == state
            saves.append(takeover.journal.journal_bytes)

        takeover.save = save
        assert sup.run() == 0
    assert sup.events.events and any(e["event"] == "group_failed" for e in sup.events.events)
    if progress_save_s[0]:
        # Fewer saves than ticks, yet every save whole (above); compactions still happen.
        assert 10 < len(saves) < len(ticks) / 3 and takeover.journal.compactions >= 1, (len(saves), len(ticks), takeover.journal.compactions)
    else:
        assert len(saves) > 100 and takeover.journal.compactions > 3, (len(saves), takeover.journal.compactions)
    assert max(saves) > 0  # the journal was used between compactions
    assert len(partials) >= 3  # the three first launches (the killed rank's group: a standby promoted)


def populated_groups(n: int) -> JobState:
    state = JobState.new(n, "/r", {"ft": {"replica_groups": n}}, "/r/control/start")
    for g in state.groups:
        g.ranks = [RankState(LaunchRecord(g.index, 0, 0, ["python", "-m", "w", f"/r/ranks/g{g.index}r0.a0.spec.json"], f"/r/logs/g{g.index}r0.a0.log", "/r"))]
    return state


def test_a_save_writes_what_changed_and_compaction_keeps_the_files_bounded(tmp_path):
    layout = RunLayout(str(tmp_path))
    takeover = Takeover(ControllerConfig(), layout)
    takeover.verify = False  # the files are read back below: no whole snapshot per save
    takeover.journal.compact_min_bytes = 1 << 10
    state = populated_groups(64)
    takeover.save(state)
    base = takeover.journal.base_bytes
    assert takeover.journal.journal_bytes == 0 and base > 0
    takeover.save(state)
    assert takeover.journal.journal_bytes == 0  # nothing changed: nothing written
    rs = state.groups[17].ranks[0]
    rs.report_offset, rs.last_step = 4096, 7
    state.step_hashes[7] = {(g.index, 0): "ab" * 16 for g in state.groups}
    takeover.save(state, groups=[17])
    line = takeover.journal.journal_bytes
    # One rank's two fields and one step's 64 hashes, held by value: a line, not the state.
    assert 0 < line < 300, line
    assert layout.read_controller_state()["groups"][17]["ranks"][0]["report_offset"] == 4096
    # Many saves: the journal is compacted into a new base whenever it outgrows the old one.
    sizes = []
    for step in range(8, 200):
        g = state.groups[step % 64]
        g.ranks[0].report_offset += 100
        g.last_step = step
        state.step_hashes[step] = {(x.index, 0): f"{step:032x}" for x in state.groups}
        state.step_hashes.pop(step - 50, None)
        takeover.save(state, groups=[g.index])
        sizes.append((takeover.journal.base_bytes, takeover.journal.journal_bytes))
    assert takeover.journal.compactions > 2
    for base_bytes, journal_bytes in sizes:
        assert journal_bytes <= max(takeover.journal.compact_min_bytes, base_bytes) + 400
    assert whole(layout.read_controller_state()) == whole(takeover.snapshot(state))
    back = from_record(JobState, {k: v for k, v in layout.read_controller_state().items() if k not in FILE_FIELDS})
    assert back == state and back.step_hashes[199] == state.step_hashes[199]


def test_a_torn_last_journal_line_is_ignored_and_a_damaged_middle_line_is_an_error(tmp_path):
    base, journal = str(tmp_path / "controller.json"), str(tmp_path / "controller.journal")
    writer = StateJournal(base, journal)
    writer.write_base({"a": 1, "groups": [{"step": 0}]})
    writer.append([[["groups", 0, "step"], 1]])
    writer.append([[["a"], 2], [["b"], {"x": [1, 2]}]])
    assert read_state(base, journal) == {"a": 2, "b": {"x": [1, 2]}, "groups": [{"step": 1}]}
    good = os.path.getsize(journal)
    writer.append([[["a"], 3], [["c"], "x" * 200]])
    writer.close(finish=False)
    stream = open(journal, "rb").read()
    # Killed mid-write: the stream cut short anywhere before the line's last compressed byte
    # (the last 5 are the flush's empty block, which carries nothing).
    for cut in (good + 1, (good + len(stream)) // 2, len(stream) - 6):
        with open(journal, "wb") as f:
            f.write(stream[:cut])
        assert read_state(base, journal) == {"a": 2, "b": {"x": [1, 2]}, "groups": [{"step": 1}]}
    with open(journal, "wb") as f:  # garbage inside the stream: not a torn write
        f.write(stream[:good] + b"\xff" * 40 + stream[good:])
    with pytest.raises(JournalDamaged, match="damaged"):
        read_state(base, journal)
    lines = [json.dumps({"generation": writer.generation, "ops": [[["a"], i]]}).encode() for i in (7, 8)]
    with open(journal, "wb") as f:  # plain lines: a damaged line with a good one after it
        f.write(lines[0][:-5] + b"\n" + lines[1] + b"\n")
    with pytest.raises(JournalDamaged, match="line 1 of 2"):
        read_state(base, journal)
    with pytest.raises(ConfigError, match="cannot be read .*nothing can take this job over"):
        RunLayout(str(tmp_path)).read_controller_state()  # one line for the command line and a takeover
    # Lines of an older generation (killed between a new base and emptying the journal): skipped.
    stale = StateJournal(base, journal)
    stale.write_base({"a": 10})
    with open(journal, "ab") as f:
        f.write(json.dumps({"generation": "old", "ops": [[["a"], 11]]}).encode() + b"\n")
    assert read_state(base, journal) == {"a": 10}
    # A plain JSON base (an older file, a test's fixture) reads as well, with no journal.
    with open(base, "w") as f:
        json.dump({"a": 5}, f)
    assert read_state(base, journal) == {"a": 5}


def test_the_incremental_reader_reads_what_a_whole_read_does_through_appends_torn_lines_and_bases(tmp_path):
    base, journal = str(tmp_path / "controller.json"), str(tmp_path / "controller.journal")
    reader = StateReader(base, journal)
    assert reader.read() is None  # no base yet
    writer = StateJournal(base, journal, compact_min_bytes=600)

    def same() -> dict:
        got = reader.read()
        assert got == read_state(base, journal)
        return got

    writer.write_base({"a": 0, "groups": [{"step": 0}]})
    assert same() == {"a": 0, "groups": [{"step": 0}]}
    bases = 0
    for i in range(1, 120):
        if writer.needs_compaction():
            writer.write_base(dict(same(), a=i))
            bases += 1
        else:
            writer.append([[["groups", 0, "step"], i], [["pad"], "x" * (i % 7) * 10]])
        if i % 3 == 0:
            same()
    assert bases >= 2 and same()["groups"][0]["step"] > 100
    # A torn last line (the stream cut short) stays unread until it is whole; a damaged one
    # with good lines after it is judged as a whole read judges it.
    before = dict(same())
    writer.append([[["a"], "torn"]])
    stream = open(journal, "rb").read()
    torn = stream[: len(stream) - 8]
    with open(journal, "wb") as f:
        f.write(torn)
    assert reader.read() == read_state(base, journal) == before
    with open(journal, "ab") as f:
        f.write(stream[len(torn) :])
    assert same()["a"] == "torn"
    with open(journal, "wb") as f:
        f.write(stream[:40] + b"\xff" * 40 + stream[40:])
    with pytest.raises(JournalDamaged):
        reader.read()
    # A new writer starts with a base: read from it, as a new controller would.
    StateJournal(base, journal).write_base({"a": "new"})
    assert same() == {"a": "new"}


def test_a_failed_write_raises_and_the_next_save_writes_everything(tmp_path):
    layout = RunLayout(str(tmp_path))
    takeover = Takeover(ControllerConfig(), layout)
    state = populated_groups(4)
    takeover.save(state)
    takeover.journal.close()
    full = StateJournal(layout.controller_state, "/dev/full")  # every write: ENOSPC
    full.write_base(takeover.mirror.record)
    takeover.journal = full
    state.groups[2].ranks[0].report_offset = 99
    with pytest.raises(OSError) as failed:
        takeover.save(state, groups=[2])
    assert failed.value.errno == errno.ENOSPC and full.needs_base
    takeover.journal = StateJournal(layout.controller_state, layout.controller_journal)
    state.groups[3].last_step = 5
    takeover.save(state, groups=[3])
    back = layout.read_controller_state()
    assert back["groups"][2]["ranks"][0]["report_offset"] == 99 and back["groups"][3]["last_step"] == 5


def test_the_check_names_a_change_the_save_was_not_told_of_and_a_record_changed_in_place(tmp_path):
    takeover = Takeover(ControllerConfig(), RunLayout(str(tmp_path)))
    takeover.verify = True
    state = populated_groups(3)
    state.last_commit = {0: {"step": 1, "participating_groups": [0, 1, 2]}}
    takeover.save(state)
    state.groups[1].restarts = 4
    with pytest.raises(AssertionError, match=r"\['groups', 1, 'restarts'\]"):
        takeover.save(state, groups=[0])  # told group 0 only
    takeover.save(state)
    # A partial save (a launch's, mid-pass) is checked for its groups: the rest is written later.
    state.groups[1].restarts, state.groups[2].restarts = 5, 6
    takeover.save(state, groups=[2], partial=True)
    with pytest.raises(AssertionError, match=r"\['groups', 0, 'restarts'\]"):  # the first of those checked
        state.groups[2].restarts = 7
        takeover.check(state, only={2})
    takeover.save(state)
    state.last_commit[0]["participating_groups"].remove(2)  # a rank's record is replaced, never changed in place
    with pytest.raises(AssertionError, match=r"\['last_commit', '0', 'participating_groups'\]"):
        takeover.save(state)


def test_keys_other_than_str_and_int_are_object_keys_and_hashes_are_held_by_value():
    state = JobState(groups=[GroupState(0)])
    state.step_hashes = {5: {(0, 0): "a", (1, 0): "a", (2, 0): "a", (3, 0): "b", (0, 1): "a"}}
    state.commit_hashes = {(5, 0): {7: (1, "a")}}
    state.transport_owner = {None: (0, 0), "http://h:1": (1, 0)}
    record = to_record(state)
    assert record["step_hashes"] == {"5": {"a": [[0, 0, 3], [0, 1, 1]], "b": [[3, 0, 1]]}}
    assert record["commit_hashes"] == {"[5, 0]": {"7": [1, "a"]}} and record["transport_owner"] == {"null": [0, 0], '"http://h:1"': [1, 0]}
    assert from_record(JobState, json.loads(json.dumps(record))) == state
    # [key, value] pairs, as files before keyed objects held them, read back too.
    old = {**record, "commit_hashes": [[[5, 0], {"7": [1, "a"]}]], "step_hashes": {"5": [[[0, 0], "a"]]}}
    back = from_record(JobState, old)
    assert back.commit_hashes == state.commit_hashes and back.step_hashes == {5: {(0, 0): "a"}}


def test_diff_and_apply_agree():
    old = {"a": [1, 2, 3, 4], "b": {"c": 1, "d": [1]}, "e": None}
    new = {"a": [1, 2, 9, 4], "b": {"c": 2, "f": "x"}, "e": 1.5}
    ops = diff(old, new)
    assert [["a", 2], 9] in ops and [["b", "d"]] in ops
    assert apply(json.loads(json.dumps(old)), json.loads(json.dumps(ops))) == new
    with pytest.raises(ValueError, match="does not apply"):
        apply({"a": 1}, [[["b", "c"], 1]])


def test_a_group_is_written_field_by_field_whatever_way_it_changed(tmp_path):
    """Groups and ranks note the fields set on them (snapshot.Tracked): a save visits the groups
    that noted a change or were replaced, and encodes the fields set, a replaced, added or removed
    rank's list whole. Every kind of change reads back as the whole snapshot does; a change made in
    place, against the rule, is named by the check the test suites run."""
    import dataclasses

    from monarch_ft.controller.state import LaunchPlan
    from monarch_ft.records.events import GroupStatus

    layout = RunLayout(str(tmp_path))
    takeover = Takeover(ControllerConfig(), layout)
    takeover.verify = True  # every save checked against the whole snapshot
    state = populated_groups(3)
    takeover.save(state)
    g0, g1, g2 = state.groups
    changes = [
        lambda: setattr(g0, "last_step", 5),  # a set
        lambda: g0.move(GroupStatus.STARTING),  # a status, set around __setattr__
        lambda: setattr(g0.ranks[0], "report_offset", 123),  # a rank's field
        lambda: setattr(g1, "restart_times", [*g1.restart_times, 4.5]),  # a list replaced
        lambda: setattr(g1, "plan", dataclasses.replace(g1.plan, at=9.0)),  # a frozen value replaced
        lambda: setattr(g1, "plan", LaunchPlan(load_step=3)),
        lambda: setattr(g2, "ranks", [*g2.ranks, RankState(LaunchRecord(2, 1, 0, ["python"], "/r/l", "/r"))]),  # a rank added
        lambda: setattr(g2.ranks[1], "last_step", 3),  # ... then changed
        lambda: setattr(g2, "ranks", [RankState(LaunchRecord(2, 0, 1, ["python"], "/r/l", "/r"), last_step=8), g2.ranks[1]]),  # one replaced
        lambda: setattr(g2, "ranks", g2.ranks[:1]),  # one removed
        lambda: state.groups.__setitem__(0, GroupState(0, last_step=2)),  # a group replaced
        lambda: setattr(state.groups[0], "attempt", 1),
    ]
    for change in changes:
        change()
        takeover.save(state)
        assert whole(layout.read_controller_state()) == whole(to_record(state))
    # Nothing set: nothing written.
    size = takeover.journal.size()
    takeover.save(state)
    assert takeover.journal.size() == size
    # A frozen record cannot change in place by mistake; a list changed in place is found.
    with pytest.raises(dataclasses.FrozenInstanceError):
        g1.plan.at = 1.0  # type: ignore[misc]
    g1.restart_times.append(7.0)
    with pytest.raises(AssertionError, match=r"\['groups', 1, 'restart_times'\]"):
        takeover.save(state)
