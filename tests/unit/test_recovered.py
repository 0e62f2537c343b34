"""monarch_ft.records.recovered: the one rule for "recovered" and MTTR, and the three places that apply it.

The fixtures are what a 2 groups x 2 ranks job records (step records as in the ranks' report
files and metrics.jsonl, events as in events.jsonl), cut down to what the rule reads, with
round times so every MTTR is exact.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from monarch_ft.records.events import EventKind
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.recovered import CONTROLLER_REPLACED, RESTARTED, Failure, RecoveryRule, recovery

T0 = 1000.0  # the fault


def step(group, s, t, members, attempt=0, rank=0, **extra):
    record = {"type": "step", "group": group, "rank": rank, "attempt": attempt, "step": s, "committed": True, "time": t}
    return {**record, "participating_groups": list(members), **extra}


def both_ranks(group, steps, t_first, members, attempt=0, **extra):
    return [step(group, s, t_first + i, members, attempt, r, **extra) for i, s in enumerate(steps) for r in (0, 1)]


def killed_and_back(history=10, hash_g1="h"):
    """Group 1 killed at T0 after committing step ``history - 1`` with group 0. Its killed attempt's
    last commit is relayed after the fault; group 0 steps alone; the relaunched attempt first
    commits alone at step 0 (not back), then with group 0 from step ``history + 9`` at T0 + 10."""
    first = T0 - history
    records = both_ranks(0, range(history), first, [0, 1]) + both_ranks(1, range(history), first, [0, 1])
    records += [step(1, history, T0 + 0.01, [0, 1])]  # written before the SIGKILL landed: the old attempt's
    records += both_ranks(0, range(history, history + 9), T0 + 1, [0])
    records += both_ranks(1, [0], T0 + 8, [1], attempt=1)
    back = history + 9
    records += both_ranks(0, range(back, back + 5), T0 + 10, [0, 1], state_hash="h")
    records += both_ranks(1, range(back, back + 5), T0 + 10, [0, 1], attempt=1, state_hash=hash_g1)
    events = [
        {"event": "group_failed", "time": T0 + 0.05, "group": 1, "attempt": 0, "reason": "exit", "rank": 0},
        {"event": "group_launched", "time": T0 + 0.6, "group": 1, "attempt": 1},
    ]
    return records, events


def failure(history=10):
    return Failure(T0, 1, 0, history - 1, frozenset({0, 1}))


def test_back_is_the_first_commit_of_a_new_attempt_with_every_group_at_the_jobs_step():
    records, events = killed_and_back()
    r = recovery(failure(), RESTARTED, events, records, ranks=2)
    # Not the old attempt's late commit (T0 + 0.01), not the new one alone at step 0 (T0 + 8).
    assert r.back_at == T0 + 10 and r.back["attempt"] == 1 and r.mttr_s == 10.0
    assert r.weights_consistent is True and r.recovered and r.settled(hashes_expected=True)
    # An in-place rule would have taken the old attempt's commit: the rule is the kind's, not a guess.
    assert recovery(failure(), RecoveryRule(), events, records).back_at == T0 + 0.01
    # Nothing after the next fault belongs to this one.
    assert recovery(failure(), RESTARTED, events, records, until=T0 + 5).back is None


def test_other_weights_are_not_a_recovery_and_half_the_hashes_are_no_verdict_yet():
    records, events = killed_and_back(hash_g1="other")
    r = recovery(failure(), RESTARTED, events, records, ranks=2)
    assert r.mttr_s == 10.0 and r.weights_consistent is False and not r.recovered and not r.settled(True)
    # Live, only rank 0 of each group has hashed yet: unknown, so not settled while hashes are expected.
    records, events = killed_and_back()
    rank0 = [m for m in records if m["rank"] == 0]
    r = recovery(failure(), RESTARTED, events, rank0, ranks=2)
    assert r.weights_consistent is None and r.recovered and not r.settled(True) and r.settled(False)


def test_a_marker_holds_the_clock_until_it_comes_and_only_the_targets_own_counts():
    records, _ = killed_and_back()
    link = RecoveryRule(marker=EventKind.LINK_RESTORED)
    # The group's link is back at T0 + 12: its commits before then do not count.
    events = [{"event": "link_restored", "time": T0 + 3, "group": 0}, {"event": "link_restored", "time": T0 + 12, "group": 1}]
    records = [m for m in records if m["attempt"] == 0 or m["group"] == 0] + both_ranks(1, range(19, 24), T0 + 10, [0, 1])
    r = recovery(failure(), link, events, records)
    assert r.marker_at == T0 + 12 and r.back_at == T0 + 12 and r.mttr_s == 12.0
    assert recovery(failure(), link, events[:1], records).back is None, "another group's link is not this one's"


def test_a_controller_is_replaced_when_the_new_one_attaches_once_the_group_is_back():
    records = both_ranks(0, range(10), T0 - 10, [0, 1]) + both_ranks(1, range(10), T0 - 10, [0, 1])
    records += both_ranks(0, range(10, 20), T0, [0, 1]) + both_ranks(1, range(10, 20), T0, [0, 1])  # never stopped
    attached = [{"event": "controller_attached", "time": T0 + 7}]
    r = recovery(failure(), CONTROLLER_REPLACED, attached, records)
    assert r.back_at == T0 + 7 and r.mttr_s == 7.0 and r.recovered
    r = recovery(failure(), CONTROLLER_REPLACED, [], records)
    assert r.back is None and r.mttr_s is None and not r.recovered, "steps alone are no new controller"


class _Job:
    """What the chaos injector reads of a job (JobControl's reading side, over recorded files)."""

    def __init__(self, run_dir, events, ranks):
        self.run_layout = RunLayout(str(run_dir))
        self.events = events
        self.cfg = SimpleNamespace(ft=SimpleNamespace(ranks_per_group=ranks), training=SimpleNamespace(state_hash_every=1))
        self.emitted = []

    def events_of(self, kind, **match):
        return [e for e in self.events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]

    def emit(self, event, **fields):
        self.emitted.append({"event": str(event), **fields})


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_the_injector_the_report_and_status_agree(tmp_path):
    """One fault, recorded once: the drill's injector (live, as records are relayed), its
    report (chaos.mttr) and ``status`` (the ranks' report files, a long history bisected)
    give the same MTTR, because they apply the same rule."""
    from chaos.injector import ChaosInjector
    from chaos.mttr import analyze_fault
    from monarch_ft.cli.jobctl import mttr_of

    history = 2000  # rank 0's report of the killed attempt is well over the 64 KiB read at once
    records, events = killed_and_back(history)
    fault = {"id": 0, "kind": "process_kill", "target": 1, "rank": 0, "at_step": 5, "injected_at": T0, "step": history - 1, "attempt": 0, "members": [0, 1]}

    # The injector, live: nothing while the group is not back, then the rule's MTTR (not the tick's).
    job = _Job(tmp_path, events, ranks=2)
    injector = ChaosInjector([], seed=0, allow_last_healthy=False, recovery_timeout_s=600)
    injector.actives = [fault]
    _write(tmp_path / "metrics.jsonl", [m for m in records if m["time"] < T0 + 9])
    injector.tick(job, T0 + 9)
    assert not job.emitted and injector.actives == [fault]
    _write(tmp_path / "metrics.jsonl", [m for m in records if m["time"] >= T0 + 9])
    injector.tick(job, T0 + 30)
    (done,) = job.emitted
    assert done["event"] == "fault_recovered" and done["seconds"] == 10.0 and done["back_at"] == T0 + 10 and injector.actives == []

    # The report.
    drill = analyze_fault(fault, events, records, False, replica_groups=2, ranks_per_group=2)
    assert drill["mttr_s"] == drill["phases"]["back_in_quorum"] == 10.0 and drill["recovered"]

    # status: the injected fault by the injector's verdict; the group failure it caused by the
    # same rule on the ranks' own reports (clock from when the controller saw it fail).
    layout = RunLayout(str(tmp_path))
    reports: dict[str, list[dict]] = {}
    for m in sorted(records, key=lambda m: m["time"]):
        reports.setdefault(f"g{m['group']}r{m['rank']}.a{m['attempt']}.jsonl", []).append(m)
    for name, recs in reports.items():
        _write(tmp_path / "ranks" / name, recs)
    assert (tmp_path / "ranks" / "g1r0.a0.jsonl").stat().st_size > 4 * 65536
    logged = [{"event": "fault_injected", "time": T0, "fault_id": 0, "kind": "process_kill", "target": 1}, *events, {**done, "time": T0 + 30}]
    state = {"groups": [{"index": 0, "attempt": 0}, {"index": 1, "attempt": 1}]}
    assert mttr_of(layout, state, logged[0], logged) == 10.0
    assert mttr_of(layout, state, events[0], logged) == 9.95
    # A Lighthouse lost and restarted meanwhile: back at the first commit after the restart of the
    # first group that had committed before (group 0, alone then), with the groups it was with.
    lost = {"event": "lighthouse_lost", "time": T0 + 2.5}
    restarted = {"event": "lighthouse_restarted", "time": T0 + 3.5}
    assert mttr_of(layout, state, lost, [*logged, lost]) is None, "not restarted yet"
    assert mttr_of(layout, state, lost, [*logged, lost, restarted]) == 1.5
