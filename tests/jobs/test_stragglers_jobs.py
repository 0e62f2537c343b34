"""A fail-slow group in a real job: group 1's host gets 30% of its CPU (a cgroup quota) from
step 40 for 30 s; under ft.straggler=evict it is named within the window, replaced by the standby on
another host, the job's committed steps per second rise again, and the weights agree.

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
def test_a_slow_group_is_evicted_to_the_standby_and_the_job_regains_its_pace(run_dir):
    need_netns()
    before = leftover_cgroups()
    drill = run_drill_job(
        run_dir,
        *FAST,
        "training.batch_size=4",
        "ft.replica_groups=3",
        "ft.ranks_per_group=1",
        # Many steps, so that evicting pays; the drill ends 40 steps after the fault recovered.
        "training.steps=2000",
        "chaos.tail_steps=40",
        "launcher=local_hosts",
        "ft.straggler=evict",
        f"ft.straggler_window={WINDOW}",
        "chaos.faults=[{kind: slow, at_step: 40, target: 1, scope: group, cpu_fraction: 0.3, duration_s: 30}]",
        timeout=540,
    )
    events = read_jsonl(run_dir / "events.jsonl")

    def of(kind):
        return [e for e in events if e["event"] == kind]

    (fault,) = drill["faults"]
    (injected,) = of("fault_injected")
    assert injected["mechanism"] == ("sigstop" if cgroup_problem() else "cgroup"), injected
    # Named, alone (no other group, before or after), within the window after the fault.
    (found,) = of("straggler_detected")
    assert (found["group"], found["slow_kind"], found["attempt"]) == (1, "cpu", 0) and found["ratio"] > 1.5, found
    # Within the window: its whole window after the fault, and named after a few windows of
    # its own commits (the quota is set half a second after the fault, once its CPU is measured; a
    # group this slow falls out of quorums, so its window of commits spans more of the job's).
    assert fault["injected_step"] <= found["steps"][0], found
    own = [m for m in read_jsonl(run_dir / "metrics.jsonl") if m["group"] == 1 and m["rank"] == 0 and m.get("committed") and m.get("attempt") == 0]
    # At most four windows: the CFS quota is granted per 100 ms period, so on a quiet machine a
    # fast step can still fit inside one period's share, run at full speed and restart the streak
    # (a quiet run named it 7.4 s after the fault, after 39 of its steps, at 5.4x its peers).
    assert len([m for m in own if fault["injected_at"] <= m["time"] <= found["time"]]) <= 4 * WINDOW, found
    (evicted,) = of("straggler_evicted")
    assert evicted["group"] == 1 and evicted["loss_s"] > evicted["cost_s"]
    assert [(e["group"], e["reason"]) for e in of("group_failed")] == [(1, "straggler")]
    # The standby took over on a host of its own; the slow host left out, then back once the slowdown ended.
    (promoted,) = of("standby_promoted")
    ready = {e["standby"]: e for e in of("standby_ready")}
    assert promoted["group"] == 1 and ready[promoted["standby"]]["slot"] >= 3
    (excluded,) = of("host_excluded")
    assert excluded["host"] == injected["host"] and "cpu straggler" in excluded["because"]
    (ended,) = of("slowdown_ended")
    (returned,) = of("host_returned")
    assert returned["host"] == injected["host"] and returned["time"] >= ended["time"] > evicted["time"]
    assert fault["recovery_path"] == "standby" and fault["evicted"] is True
    # Faster again than while slowed, with the same weights everywhere. Not ">= 0.9 x before":
    # the 30 steps after the standby took over are when the pool builds its replacement (a new
    # process importing torch, on 2 shared cores); two runs measured 0.64 and 1.88, so the ratio
    # is reported (drill.json, docs/results/drill-stragglers), not asserted.
    rates = fault["throughput_steps_per_s"]
    assert rates["after"] > rates["during"] and fault["throughput_ratio"] is not None, rates
    assert fault["recovered"] and fault["weights_consistent"] is True and drill["weights_consistent"], fault
    assert drill["steps_lost"] == 0 and drill["steps_never_go_back"]
    # status tells it; no cgroup is left behind.
    (line,) = job_status(str(run_dir)).stragglers
    assert line.startswith("group 1 (attempt 0) cpu straggler") and ": evicted," in line
    assert sorted(set(leftover_cgroups()) - set(before)) == []
    print(f"throughput steps/s: {rates}; named at steps {found['steps']} ({found['ratio']}x), fault at step {fault['injected_step']}")


@pytest.mark.slow
def test_a_slow_link_is_found_by_probing_named_alone_and_evicted_to_the_standby(run_dir):
    """Group 1's host link at 20 Mbit/s from step 20 for 20 s: every group's collective time rises
    alike (a ring allreduce), so the controller probes each rank's link, names group 1 alone as a
    link straggler, and under evict the standby (another host, a healthy link) takes its place."""
    need_netns()
    drill = run_drill_job(
        run_dir,
        *FAST,
        "ft.replica_groups=3",
        "ft.ranks_per_group=1",
        "training.steps=2000",
        "chaos.tail_steps=20",
        "launcher=local_hosts",
        "ft.straggler=evict",
        "chaos.faults=[{kind: slow_link, at_step: 20, target: 1, rate: 20mbit, duration_s: 20}]",
        timeout=300,
    )
    events = read_jsonl(run_dir / "events.jsonl")

    def of(kind):
        return [e for e in events if e["event"] == kind]

    (fault,) = drill["faults"]
    (injected,) = of("fault_injected")
    # Named by a probe round the collective's rise started, as a link straggler, and nobody else on
    # their link ever. (A CPU straggler named before the fault is the compute detector's on a
    # heavily loaded machine: a run at load average 30 named a group 2.8x slower for 10 steps of
    # 15 ms, kept, cleared 1.4 s later; it is never evicted: only group 1 fails.)
    detected = of("straggler_detected")
    (found,) = [e for e in detected if e["slow_kind"] == "link"]
    assert all(e["slow_kind"] == "cpu" and e["time"] < injected["time"] for e in detected if e is not found), detected
    assert (found["group"], found["attempt"]) == (1, 0), found
    assert found["ratio"] > 1.5 and found["seconds"] > found["median_s"] + 0.02 and found["loss_s_per_step"] > 0, found
    rounds = of("link_probed")
    named = [r for r in rounds if r["stragglers"]]
    assert named and named[0]["reason"] == "collective_rose" and named[0]["time"] > injected["time"], rounds
    assert all(r["stragglers"] == [1] for r in named) and all(r["time"] > injected["time"] for r in named), rounds
    # Evicted by the same rule as a CPU straggler; the standby took over on a host of its own.
    (evicted,) = of("straggler_evicted")
    assert (evicted["group"], evicted["slow_kind"]) == (1, "link") and evicted["loss_s"] > evicted["cost_s"], evicted
    assert [(e["group"], e["reason"]) for e in of("group_failed")] == [(1, "straggler")]
    (promoted,) = of("standby_promoted")
    ready = {e["standby"]: e for e in of("standby_ready")}
    assert promoted["group"] == 1 and ready[promoted["standby"]]["slot"] >= 3
    (excluded,) = of("host_excluded")
    assert excluded["host"] == injected["host"] and "link straggler" in excluded["because"], excluded
    (restored,) = of("link_restored")
    (returned,) = of("host_returned")
    assert returned["host"] == injected["host"] and returned["time"] >= restored["time"]
    assert fault["evicted"] is True and fault["recovered"] and fault["weights_consistent"] is True and drill["weights_consistent"], fault
    (line,) = [x for x in job_status(str(run_dir)).stragglers if " link straggler" in x]
    assert line.startswith("group 1 (attempt 0) link straggler") and " per 256 KiB (" in line and ": evicted," in line, line
    print(f"named {found['seconds']} s vs {found['median_s']} s ({found['mbit_s']} Mbit/s), {len(rounds)} probe rounds, {fault['throughput_steps_per_s']}")
