"""Fail-slow groups in one real job, the drill of docs/results/drill-stragglers: group 1's host gets
30% of its CPU (a cgroup quota) from step 40 for 30 s, then group 2's link is limited to 20 Mbit/s for
20 s. Under ft.straggler=evict each is named (the CPU straggler within the window, the link by two probe
rounds in a row), replaced by a standby on another host, its host left out and back once the fault ends; the
job's committed steps per second rise again and the weights agree. One job for both faults: each
costs a job start and a standby build, a minute of the suite on 2 cores.

The other policies (report names it and evicts nobody, no standby keeps it, a job about to
end keeps it, machine-wide load names nobody) are decisions on the same records: the fast
tests cover them (tests/unit/test_stragglers.py, test_loop_sequences.py), so one job suffices.
"""

from __future__ import annotations

import pytest

from monarch_ft.cli.jobctl import job_status
from monarch_ft.common.throttle import cgroup_problem, leftover_cgroups
from monarch_ft.testing.jobs import FAST, need_netns, read_jsonl, run_drill_job

WINDOW = 10


@pytest.mark.slow
@pytest.mark.long(3)
def test_a_slow_group_and_a_slow_link_are_named_and_evicted_to_standbys(run_dir):
    need_netns()
    before = leftover_cgroups()
    drill = run_drill_job(
        run_dir,
        *FAST,
        "training.batch_size=4",
        "ft.replica_groups=3",
        "ft.ranks_per_group=1",
        # The drill ends 40 steps after the last fault recovered; the step count is only a cap far
        # past it (and makes evicting pay). Each fault waits for a standby, and a standby builds in
        # the background: beside other busy processes it takes minutes, not seconds, and a cap of
        # 2000 steps ran out before the second fault (three runs beside two CPU hogs).
        "training.steps=20000",
        "chaos.tail_steps=40",
        "launcher=local_hosts",
        "ft.straggler=evict",
        f"ft.straggler_window={WINDOW}",
        # The link fault waits for the next standby (chaos's wait_standby), as the first does.
        "chaos.faults=[{kind: slow, at_step: 40, target: 1, scope: group, cpu_fraction: 0.3, duration_s: 30},"
        " {kind: slow_link, at_step: 300, target: 2, rate: 20mbit, duration_s: 20}]",
        timeout=540,
    )
    events = read_jsonl(run_dir / "events.jsonl")

    def of(kind):
        return [e for e in events if e["event"] == kind]

    slow, link = drill["faults"]
    slow_injected, link_injected = of("fault_injected")
    assert slow_injected["mechanism"] == ("sigstop" if cgroup_problem() else "cgroup"), slow_injected
    detected = of("straggler_detected")
    # The slow group: named on its CPU, within four windows of its steps after the fault. Another
    # CPU straggler may be named too, even first, on a heavily loaded machine (a run at load
    # average 30 named a group 2.8x slower for 10 steps of 15 ms; beside two CPU hogs a healthy
    # group was named 1.8-3.4x slower for 10-20 steps, often as the throttled group dropped out of
    # the quorum): it is kept until it has cost one recovery, cleared once back to pace, never
    # evicted (only the two faulty groups fail, below).
    found = next(e for e in detected if e["time"] > slow_injected["time"] and e["group"] == 1 and e["attempt"] == 0)
    assert found["slow_kind"] == "cpu" and found["ratio"] > 1.5, detected
    for other in [e for e in detected if e["slow_kind"] == "cpu" and (e["group"], e["attempt"]) != (1, 0)]:
        kept = [e for e in of("straggler_kept") if e["group"] == other["group"] and e["time"] >= other["time"]]
        assert kept and kept[0]["why"] in ("not_slow_long_enough", "no_standby"), (other, kept)
    # Named on the slowed steps: most of the steps judged (first, last) came after the fault, so
    # its median ratio is theirs (a rule may judge a window or two with a few fast steps in it).
    first, last = found["steps"]
    assert last - slow["injected_step"] + 1 > (last - first + 1) / 2, (found, slow["injected_step"])
    own = [m for m in read_jsonl(run_dir / "metrics.jsonl") if m["group"] == 1 and m["rank"] == 0 and m.get("committed") and m.get("attempt") == 0]
    # Within four windows of its own steps. The CFS quota is granted per 100 ms period, so now and
    # then a step fits in one period's share and runs at full speed: on every-step windows alone it
    # took 39-126 of its steps; the detector judges each step's own time (the whole iteration less
    # its waits for the peers) and names a group slow on most steps of one window, or of two
    # (stragglers._verdict, the replays in tests/unit/test_stragglers.py).
    assert len([m for m in own if slow["injected_at"] <= m["time"] <= found["time"]]) <= 4 * WINDOW, found
    # The slow link: the ring allreduce makes every group's collective time rise alike, so a probe
    # round the collective's rise started finds group 2 alone slow, and the round a second later
    # that confirms it names it, as a link straggler.
    (named_link,) = [e for e in detected if e["slow_kind"] == "link"]
    assert (named_link["group"], named_link["attempt"]) == (2, 0) and named_link["time"] > link_injected["time"], named_link
    assert named_link["ratio"] > 1.5 and named_link["seconds"] > named_link["median_s"] + 0.02 and named_link["loss_s_per_step"] > 0, named_link
    rounds = of("link_probed")
    named = [r for r in rounds if r["stragglers"]]
    assert named and all(r["stragglers"] == [2] for r in named), rounds
    first = rounds.index(named[0])
    suspected = rounds[first - 1]
    assert (suspected["reason"], suspected["suspects"], suspected["stragglers"]) == ("collective_rose", [2], []), rounds
    assert suspected["time"] > link_injected["time"] and named[0]["reason"] == "confirm", rounds
    # Both evicted by the one rule (the loss outweighs a recovery; the CPU straggler once it has
    # cost one since it was named, so a healthy group named for a burst of load beside CPU hogs
    # is kept: stragglers.cost_so_far), each to a standby on a host of its own.
    evicted = of("straggler_evicted")
    assert [(e["group"], e["slow_kind"]) for e in evicted] == [(1, "cpu"), (2, "link")], evicted
    assert all(e["loss_s"] > e["cost_s"] for e in evicted), evicted
    assert [(e["group"], e["reason"]) for e in of("group_failed")] == [(1, "straggler"), (2, "straggler")]
    ready = {e["standby"]: e for e in of("standby_ready")}
    promoted = of("standby_promoted")
    assert [p["group"] for p in promoted] == [1, 2] and all(ready[p["standby"]]["slot"] >= 3 for p in promoted), promoted
    # Each faulty host left out, then back once its fault ended.
    excluded = of("host_excluded")
    assert [e["host"] for e in excluded] == [slow_injected["host"], link_injected["host"]], excluded
    assert "cpu straggler" in excluded[0]["because"] and "link straggler" in excluded[1]["because"], excluded
    returned = {e["host"]: e for e in of("host_returned")}
    (ended,) = of("slowdown_ended")
    (restored,) = of("link_restored")
    assert returned[slow_injected["host"]]["time"] >= ended["time"] > evicted[0]["time"]
    assert returned[link_injected["host"]]["time"] >= restored["time"]
    # Faster again than while slowed, with the same weights everywhere. Not ">= 0.9 x before":
    # the 30 steps after a standby took over are when the pool builds its replacement (a new
    # process importing torch, on 2 shared cores: docs/results/drill-stragglers), so the ratio is
    # reported in drill.json, not asserted.
    for fault in (slow, link):
        assert fault["recovery_path"] == "standby" and fault["evicted"] is True, fault
        assert fault["recovered"] and fault["weights_consistent"] is True and fault["throughput_ratio"] is not None, fault
    assert slow["throughput_group_steps_per_s"]["after"] > slow["throughput_group_steps_per_s"]["during"], slow
    assert drill["weights_consistent"] and drill["steps_lost"] == 0 and drill["steps_never_go_back"]
    # status tells both; no cgroup is left behind.
    lines = job_status(str(run_dir)).stragglers
    # The evicted one (attempt 0); a group slowed while the next standby builds may be named too,
    # and kept (no standby is ready then), as the comment at the top says.
    (cpu_line,) = [x for x in lines if x.startswith("group 1 (attempt 0) cpu straggler")]
    (link_line,) = [x for x in lines if " link straggler" in x]
    assert ": evicted," in cpu_line, lines
    assert link_line.startswith("group 2 (attempt 0) link straggler") and " per 256 KiB (" in link_line and ": evicted," in link_line, lines
    assert sorted(set(leftover_cgroups()) - set(before)) == []
    print(f"slow: {slow['throughput_group_steps_per_s']} named at steps {found['steps']} ({found['ratio']}x)")
    print(f"link: {link['throughput_group_steps_per_s']}, {len(rounds)} probe rounds")
