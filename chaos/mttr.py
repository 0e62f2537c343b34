"""MTTR per fault, phase by phase, read off the supervisor's event log and metrics.

Phases (seconds after injection):
  detected            the supervisor saw the failure (exit, signal, hang timeout), or for a
                      collective fault the first step TorchFT refused to commit;
  survivors_stepping  first committed step of another group without the failed one
                      (collective: first committed step of any group after detection);
  replacement_up      every rank of the relaunched group has built its model (restarts only);
  weights_recovered   the relaunched group's ranks all received the live weights
                      (full restart: they loaded the disk checkpoint);
  back_in_quorum      the failed group commits a step with every group it was with, at or
                      past the job's step when the fault hit (monarch_ft.records.recovered's rule,
                      the one the injector and ``status`` apply too).
MTTR is back_in_quorum (a controller fault's clock stops when the new one attaches). Silent
faults (bitflip, ckpt_corrupt): detected is the controller's integrity verdict (the kind's
``detected_by``); a group it failed is relaunched and heals as after a restart; drill.json also
gives the step the fault landed at, the step it was caught at, and the latency in steps. Network faults (partition, slow_link on a simulated host's link):
detected is the first of the group failing (the supervisor restarted it) or a commit of
another group without it (dropped from the quorum), None if neither happened (the job
absorbed a slow link); replacement_up only if it was restarted; back_in_quorum is the
group's first commit with every group it was with after the link was restored.
Also per fault: the survivors' longest stall between committed steps, steps lost (a
committed step number that went back), and whether the
rejoined group's state hash equals the healthy groups' at the first step all report.
On a cluster (launcher=slurm), ``scheduler`` (:func:`scheduler_times`): the scheduler's own
view beside ours, for a fault that took a node down: when Slurm counted it not responding and
down, when the controller excluded it and when it was back in the pool; and for any fault,
the node and allocation time (submission to running) of the replacement's job.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from chaos.kinds import FaultCategory, fault_kind
from chaos.outcome import recovery_path
from monarch_ft.records.events import PHASES  # one definition, shared with chaos.report
from monarch_ft.records.events import EventKind, NodeHealth, event_node
from monarch_ft.records.goodput import lineage, rollbacks_of, windows
from monarch_ft.records.members import members_of
from monarch_ft.records.recovered import Failure, recovery


def _first(items, pred):
    return next((x for x in items if pred(x)), None)


def analyze_fault(
    fault: dict,
    events: list[dict],
    metrics: list[dict],
    full_restart: bool,
    replica_groups: int,
    ranks_per_group: int,
    until: float = float("inf"),
    since: float = float("-inf"),
) -> dict[str, Any]:
    """``until``: the next fault's injection; nothing after it belongs to this fault. ``since``:
    the previous fault's recovery (the throughput before this fault is measured after it)."""
    t0, g = fault["injected_at"], fault["target"]
    kind = fault_kind(fault["kind"])
    all_metrics = metrics
    events = [e for e in events if e["time"] < until]
    metrics = [m for m in metrics if m["time"] < until]
    restart = kind.category is FaultCategory.RESTART
    network = kind.category is FaultCategory.NETWORK
    control = kind.category is FaultCategory.CONTROL_PLANE
    silent = kind.category is FaultCategory.SILENT
    ev = sorted((e for e in events if e["time"] >= t0), key=lambda e: e["time"])
    commits = sorted((m for m in metrics if m["rank"] == 0 and m.get("committed") and m["time"] >= t0), key=lambda m: m["time"])
    # A refused commit is a sync that did not commit (localsgd/diloco inner steps are no syncs).
    refused = sorted((m for m in metrics if m.get("sync", True) and not m.get("committed") and m["time"] >= t0), key=lambda m: m["time"])
    times: dict[str, Optional[float]] = dict.fromkeys(PHASES)
    # When the group is back, and with which weights: the one rule (monarch_ft.records.recovered).
    members = fault.get("members")
    if members is None:  # a drill that did not record them: the group's newest commit before the fault
        before = [m for m in metrics if m["rank"] == 0 and m.get("committed") and m["group"] == g and m["time"] < t0]
        members = Failure.after_commit(t0, g, fault["attempt"], max(before, key=lambda m: m["time"], default=None), range(replica_groups)).members
    failure = Failure(t0, g, fault["attempt"], fault["step"], frozenset(members) | {g})
    verdict = recovery(failure, kind.recovery, ev, all_metrics, ranks=ranks_per_group, until=until)

    if restart:
        e = _first(ev, lambda e: e["event"] == "group_failed" and e["group"] == g)
        times["detected"] = e and e["time"]
    elif control:
        # The job's control plane: a new controller attached (its loss is seen then) / the
        # supervisor saw its Lighthouse die. No group stops, so survivors step throughout.
        e = _first(ev, lambda e: e["event"] == kind.detected_by)
        times["detected"] = e and e["time"]
    elif silent:
        # The controller's integrity verdict on it (a rollback names no one group: the job's).
        found = _first(ev, lambda e: e["event"] == kind.detected_by and e.get("group") in (g, None))
        times["detected"] = found and found["time"]
    elif network:
        failed = _first(ev, lambda e: e["event"] == "group_failed" and e["group"] == g)
        dropped = _first(commits, lambda m: m["group"] != g and g not in members_of(m))
        seen = [x["time"] for x in (failed, dropped) if x]
        times["detected"] = min(seen) if seen else None
    elif kind.recovery.marker is not None:
        # The rank acts on the request (its marker) at its next allreduce; the fault starts
        # there, and shows as the first step TorchFT refused to commit after it.
        m = verdict.marker_at is not None and _first(refused, lambda m: m["time"] >= verdict.marker_at)
        times["detected"] = m["time"] if m else None
    detected = times["detected"]

    if detected is not None:
        m = None
        if (restart or network or silent) and not full_restart:
            m = _first(commits, lambda m: m["group"] != g and g not in members_of(m) and m["time"] >= detected)
        if m is None and (silent or not (restart or network) or full_restart):
            # A silent fault no group was failed for (a checkpoint set aside), or a rollback of every group.
            m = _first(commits, lambda m: m["time"] >= detected)
        times["survivors_stepping"] = m and m["time"]

    new_attempt = fault["attempt"] + 1
    was_relaunched = any(e["event"] == "group_launched" and e["group"] == g and e["attempt"] >= new_attempt for e in ev)
    # A network fault that ended in a restart: phases as for a restart from then on.
    relaunched = (network or silent) and was_relaunched
    if restart or relaunched:
        first_ready: dict[int, float] = {}
        for e in ev:
            if e["event"] == "model_ready" and e["group"] == g and e["attempt"] >= new_attempt:
                first_ready.setdefault(e["rank"], e["time"])
        if len(first_ready) == ranks_per_group:
            times["replacement_up"] = max(first_ready.values())
    healed = [e for e in ev if e["event"] == "weights_recovered" and e["group"] == g and (not restart or e["attempt"] >= new_attempt)]
    loaded = [e for e in ev if e["event"] == "checkpoint_loaded" and e["group"] == g and e["attempt"] >= new_attempt]
    source = healed or loaded
    if source:
        per_rank = {}
        for e in source:
            per_rank.setdefault(e["rank"], e)
        times["weights_recovered"] = max(e["time"] for e in per_rank.values())
    elif restart and times["replacement_up"] is not None:
        # A restarted group that caught up at step 0 with nothing to fetch (no peer ahead).
        times["weights_recovered"] = times["replacement_up"]

    times["back_in_quorum"] = verdict.back_at
    phases = {k: (round(v - t0, 3) if v is not None else None) for k, v in times.items()}
    if not restart and not relaunched:
        phases["replacement_up"] = None
        if not healed:
            phases["weights_recovered"] = None
    end = times["back_in_quorum"]

    stall, lost = 0.0, 0
    for sg in range(replica_groups):
        if sg == g:
            continue
        seq = sorted((m for m in metrics if m["group"] == sg and m["rank"] == 0 and m.get("committed")), key=lambda m: m["time"])
        for a, b in zip(seq, seq[1:]):
            if b["time"] >= t0 and (end is None or a["time"] <= end):
                stall = max(stall, b["time"] - a["time"])
                lost += max(0, a["step"] + 1 - b["step"])
    # Inner steps trained and then thrown away: the failed group's unsynced window (up to a
    # whole window in localsgd/diloco, the step in flight in hsdp), and any window whose sync
    # failed while this fault lasted.
    window_end = end if end is not None else until
    discarded = [
        x
        for x in batch_accounting(all_metrics)["discarded"]
        if (x["group"] == g and x["attempt"] == fault["attempt"] and x["tail"]) or t0 <= x["time"] <= window_end
    ]
    recovered_from = _first(healed, lambda e: True)
    scheduler = scheduler_times(fault, events, new_attempt)
    steps = detection_steps(kind, g, t0, ev, all_metrics, times["detected"])
    # Committed steps the job itself gave up while this fault lasted (a rollback to a
    # checkpoint because no group held its state): zero is the point of live recovery.
    rollbacks = [e for e in ev if e["event"] == "job_rollback"]
    failed = _first(ev, lambda e: e["event"] == "group_failed" and e["group"] == g)
    # Throughput after: from the group's first commit with its peers after an eviction (its
    # standby took over: the job runs at full speed again, whatever the slowness does on the
    # old host), else from its recovery.
    evicted = _first(ev, lambda e: e["event"] == "straggler_evicted" and e["group"] == g)
    after_from = verdict.back_at
    if evicted is not None:
        back = _first(
            commits,
            lambda m: m["group"] == g and m.get("attempt", 0) > fault["attempt"] and set(members) <= set(members_of(m)),
        )
        after_from = back["time"] if back else after_from
    rates = throughput(all_metrics, t0, after_from, since=since, until=until, rollbacks=rollbacks_of(events))
    return {
        **{k: fault[k] for k in ("id", "kind", "target", "rank", "at_step", "injected_at")},
        "at_s": fault.get("at_s"),
        "mode": fault.get("mode"),
        "injected": True,
        "injected_step": fault["step"],
        # How the group came back (monarch_ft.records.events.RecoveryPath; None: no relaunch, in place).
        "recovery_path": recovery_path(ev, g, t0, until, was_relaunched),
        # A hang verdict: which rank was blamed and why, and the stacks captured then.
        "blamed_rank": failed.get("rank") if failed and failed.get("reason") == "hung" else None,
        "blame": failed.get("blame") if failed else None,
        "stacks": failed.get("stacks") if failed else None,
        "phases": phases,
        # Where the kind's clock stops (a controller fault: once a new controller supervises).
        "mttr_s": verdict.mttr_s,
        # One meaning, the chaos injector's and status's too: back in the quorum at the job's
        # step with the same weights (unknown weights, no hashes reported, do not count against it).
        "recovered": verdict.recovered,
        "weights_consistent": verdict.weights_consistent,
        "survivor_max_stall_s": round(stall, 3),
        "survivor_steps_lost": lost,
        "job_steps_lost": sum(e["steps_lost"] for e in rollbacks),
        "group_steps_discarded": sum(x["steps"] for x in discarded),
        "recovery_bytes": sum(e.get("bytes", 0) for e in healed) or None,
        "recovery_seconds": max((e.get("seconds", 0) for e in healed), default=None),
        "recovered_from_group": recovered_from.get("src_group") if recovered_from else None,
        **({"scheduler": scheduler} if scheduler else {}),
        # Steps: where the fault landed (the rank's own report, else the target's step when
        # injected), where it was caught, and how many steps it went unseen.
        **steps,
        # A straggler evicted (ft.straggler=evict) while the fault lasted, and the job's
        # useful group-steps per second around the fault (``throughput_ratio``: after / before;
        # None with ``throughput_group_steps_per_s.why`` saying what was missing).
        "evicted": evicted is not None,
        "throughput_group_steps_per_s": rates,
        "throughput_ratio": rates["ratio"],
    }


# Group-steps each side of a fault the throughput is measured over (a rate over fewer is noise):
# about 30 job steps of two groups.
THROUGHPUT_GROUP_STEPS = 60


def step_rate(
    metrics: list[dict], start: float, end: float, steps: Optional[int] = None, last: bool = False, rollbacks: Iterable[dict] = ()
) -> Optional[float]:
    """Useful group-steps per second in [start, end): the (group, step) pairs of the final
    history (monarch_ft.records.goodput.lineage: a step later rolled back, or trained and never
    kept, does not count) whose own step fell there, over the time they took. ``steps``: only
    the first (``last``: the last) that many. None: fewer than 3 there (no rate to speak of).

    Args:
        metrics: step records (any order).
        start, end: the window.
        steps: at most this many group-steps.
        last: take the window's last group-steps (the rate just before a fault), not its first.
        rollbacks: ``job_rollback`` events.
    """
    times = sorted(t for t in lineage(metrics, rollbacks).step_times.values() if start <= t < end)
    if steps is not None:
        times = times[-steps:] if last else times[:steps]
    if len(times) < 3 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def throughput(
    metrics: list[dict], t0: float, back_at: Optional[float], since: float = float("-inf"), until: float = float("inf"), rollbacks: Iterable[dict] = ()
) -> dict[str, Any]:
    """Useful group-steps per second before a fault, while it lasted, and after its recovery.

    ``before``: the last :data:`THROUGHPUT_GROUP_STEPS` group-steps in [``since``, ``t0``) (``since``:
    the previous fault's recovery, so that the rate before is not one of an earlier disruption);
    ``during``: from ``t0`` to ``back_at``; ``after``: the first :data:`THROUGHPUT_GROUP_STEPS` from
    ``back_at`` (before ``until``, the next fault). ``ratio``: after / before (None when either is
    unknown; ``why`` then says which was missing): 1 is full speed again.

    Args:
        metrics: step records.
        t0: when the fault hit.
        back_at: when it was recovered (for an evicted straggler: its standby back in the
            quorum); None: never, and nothing is measured after it.
        since: nothing before this counts for ``before``.
        until: nothing from this on counts.
        rollbacks: ``job_rollback`` events (steps they gave up do not count).
    """
    before = step_rate(metrics, since, t0, THROUGHPUT_GROUP_STEPS, last=True, rollbacks=rollbacks)
    during = step_rate(metrics, t0, back_at if back_at is not None else until, rollbacks=rollbacks)
    after = step_rate(metrics, back_at, until, THROUGHPUT_GROUP_STEPS, rollbacks=rollbacks) if back_at is not None else None
    rnd = lambda x: round(x, 3) if x is not None else None  # noqa: E731
    why = None
    if back_at is None:
        why = "not recovered"
    elif before is None:
        why = "fewer than 3 group-steps between the previous fault's recovery and this fault"
    elif after is None:
        why = "fewer than 3 group-steps between its recovery and the next fault or the end"
    return {
        "before": rnd(before),
        "during": rnd(during),
        "after": rnd(after),
        "ratio": rnd(after / before) if after is not None and before else None,
        "since": since if since != float("-inf") else None,
        "why": why,
    }


def scheduler_times(fault: dict, events: list[dict], new_attempt: int) -> Optional[dict[str, Any]]:
    """The scheduler's side of one fault, seconds after injection (None: not seen).

    Args:
        fault: the injected fault (its ``fault_injected`` event names the node it took down).
        events: the job's events up to the next fault's injection.
        new_attempt: the target group's attempt that replaced the failed one.

    Returns:
        None for a job without nodes (no ``node_state`` event); else ``failed_node`` (the node
        the fault took down, None for a fault of processes), ``not_responding_s`` (Slurm's own
        detection: the node first counted not responding or down), ``down_s`` (set DOWN),
        ``excluded_s`` (the controller kept new jobs off it), ``returned_s`` (back in the
        pool), ``replacement_node`` and ``replacement_allocation_s`` (the job the group came
        back in: its node, and its submission to running; a promoted standby's was made
        before the fault, off the recovery's clock).
    """
    if not any(e["event"] in (EventKind.NODE_STATE, EventKind.GROUP_PLACED) for e in events):
        return None
    t0, g = fault["injected_at"], fault["target"]
    ev = sorted((e for e in events if e["time"] >= t0), key=lambda e: e["time"])
    injected = _first(ev, lambda e: e["event"] == "fault_injected" and e.get("fault_id") == fault["id"])
    node = event_node(injected) if injected else None

    def after(pred) -> Optional[float]:
        e = _first(ev, pred)
        return round(e["time"] - t0, 3) if e else None

    out: dict[str, Any] = {"failed_node": node}
    if node is not None:
        gone = (NodeHealth.NOT_RESPONDING, NodeHealth.DOWN)
        out["not_responding_s"] = after(lambda e: e["event"] == EventKind.NODE_STATE and event_node(e) == node and e.get("health") in gone)
        out["down_s"] = after(lambda e: e["event"] == EventKind.NODE_STATE and event_node(e) == node and e.get("health") == NodeHealth.DOWN)
        out["excluded_s"] = after(lambda e: e["event"] == EventKind.NODE_EXCLUDED and event_node(e) == node)
        out["returned_s"] = after(lambda e: e["event"] == EventKind.NODE_RETURNED and event_node(e) == node)
    promoted = _first(ev, lambda e: e["event"] == "standby_promoted" and e["group"] == g and e["attempt"] >= new_attempt)
    if promoted is not None:
        placed = [e for e in events if e["event"] == EventKind.GROUP_PLACED and e.get("standby") == promoted["standby"]]
    else:
        placed = [e for e in ev if e["event"] == EventKind.GROUP_PLACED and e.get("group") == g and e["attempt"] >= new_attempt]
    out["replacement_node"] = event_node(placed[0]) if placed else None
    out["replacement_allocation_s"] = placed[0].get("allocation_s") if placed and promoted is None else None
    return out


def detection_steps(kind, group: int, t0: float, events: list[dict], metrics: list[dict], detected: Optional[float]) -> dict[str, Optional[int]]:
    """``hit_step`` (the kind's ``hit_by`` event's step: a bit flip lands at the rank's next
    step), ``detected_step`` (the detection event's ``detected_step_field``, else the target's
    newest committed step when it was detected) and ``detection_latency_steps`` (their
    difference: 0 is caught in the very step it landed in)."""
    hit = _first(events, lambda e: kind.hit_by is not None and e["event"] == kind.hit_by and e.get("group") == group and e["time"] >= t0)
    found = _first(events, lambda e: detected is not None and e["time"] == detected and e["event"] == kind.detected_by) if kind.detected_by else None
    detected_step = None
    if found is not None and kind.detected_step_field:
        detected_step = found.get(kind.detected_step_field)
    elif detected is not None:
        before = [m["step"] for m in metrics if m["group"] == group and m["rank"] == 0 and m.get("committed") and m["time"] <= detected]
        detected_step = max(before, default=None)
    hit_step = hit.get("step") if hit is not None else None
    latency = detected_step - hit_step if detected_step is not None and hit_step is not None else None
    return {"hit_step": hit_step, "detected_step": detected_step, "detection_latency_steps": latency}


def steps_never_go_back(metrics: list[dict], rollbacks: list[dict] = ()) -> bool:
    """No committed step number goes back: per rank and attempt steps strictly increase,
    and no quorum commits a step below one an earlier quorum committed (a group that
    restarted from scratch instead of healing would; see controller.ledger.CommitLedger for why
    quorums, not record times, tell). Full restarts go back by design, and so does a recorded
    rollback in ``rollbacks`` (``job_rollback`` events: two replicas that disagreed, with no
    majority, went back to a verified checkpoint): the job's step is that rollback's from then on."""
    from monarch_ft.controller.ledger import CommitLedger

    last: dict[tuple[int, int, int], int] = {}
    ledger = CommitLedger()
    pending = sorted(rollbacks, key=lambda e: e["time"])
    for m in sorted(metrics, key=lambda m: m["time"]):
        while pending and pending[0]["time"] <= m["time"]:
            ledger.rollback(pending.pop(0)["to_step"])
        if not m.get("committed"):
            continue
        key = (m["group"], m["rank"], m["attempt"])
        if key in last and m["step"] <= last[key]:
            return False
        if ledger.record(m["step"], m.get("quorum_id") or 0) is not None:
            return False
        last[key] = m["step"]
    return True


def batch_accounting(metrics: list[dict]) -> dict[str, Any]:
    """Which batches the job kept, per group, from rank 0's step records (any ft.mode).

    The windows are monarch_ft.records.goodput's (the one rule of what a sync keeps): a group's
    inner steps are provisional until a sync keeps them; a sync that failed, a window replaced
    by a heal, a sync the group's batch was not part of, and the steps a group trained before
    it died are discarded. Returns ``kept`` {group: [batch, ...] in order}, ``windows``
    [(group, sync step, [batches])] for each kept window, and ``discarded`` [{group, attempt,
    steps, time, tail}]."""
    kept: dict[int, list[int]] = {}
    kept_windows: list[tuple[int, int, list[int]]] = []
    discarded: list[dict] = []
    for w in windows(metrics):
        batches = [r.get("batch", r["step"]) for r in w.steps]
        if w.kept:
            kept.setdefault(w.group, []).extend(batches)
            kept_windows.append((w.group, w.sync["step"], batches))
        elif batches:
            discarded.append({"group": w.group, "attempt": w.attempt, "steps": len(batches), "time": w.time, "tail": w.sync is None})
    return {"kept": kept, "windows": kept_windows, "discarded": discarded}
