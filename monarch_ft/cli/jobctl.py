"""The job from the command line: ``status``, ``stacks``, ``stop`` and ``verify`` (``python -m monarch_ft``).

Each reads the run directory only (``controller.json``, ``events.jsonl``, the ranks'
report files, the lock), so it works with or without a controller attached, on a live
or a finished run, from any shell on the machine. :mod:`monarch_ft.__main__` is a thin
argument parser over these functions.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from monarch_ft.common.process import ProcessIdentity
from monarch_ft.common.stacks import capture_stacks
from monarch_ft.controller.checkpoints import CheckpointHealth, quarantined
from monarch_ft.controller.takeover import controller_attached
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, GiveUpReason, JobStatus, RecoveryPath
from monarch_ft.records.layout import RunLayout, atomic_write, read_json, read_jsonl
from monarch_ft.records.lease import heartbeat_time
from monarch_ft.records.manifest import MANIFEST, step_dir, steps_on_disk, verify_step
from monarch_ft.records.reports import read_records, tail_records
from monarch_ft.records.recovered import SEEN_FAILURES, Failure, is_back, marker_time, recovery

# Fault events a status lists (injected by a drill, or seen by the supervisor).
_FAULT_KINDS = (EventKind.FAULT_INJECTED, *SEEN_FAILURES)


def open_run(run_dir: str) -> tuple[RunLayout, dict]:
    """The run's layout and takeover state; ConfigError (one line) if it is no run directory."""
    layout = RunLayout(run_dir)
    if not os.path.isdir(layout.run_dir):
        raise ConfigError(f"{run_dir}: no such directory: give the run directory of a job (its hydra.run.dir)")
    state = layout.read_controller_state()
    if not state:
        raise ConfigError(f"{run_dir}: no controller.json: not the run directory of a job started by this version of monarch_ft")
    return layout, state


@dataclass
class GroupView:
    index: int
    state: str
    attempt: int
    step: int
    loss: Optional[float]
    restarts: int
    ranks_alive: int
    ranks: int
    # Why it was given up (GiveUpReason), and its latest failure's error (records.reports.error_record).
    gave_up: Optional[str] = None
    last_error: Optional[dict] = None


@dataclass
class JobStatusView:
    run_dir: str
    status: str
    controller_pid: Optional[int]
    heartbeat_age_s: Optional[float]
    lighthouse: str
    job_step: int
    groups: list[GroupView] = field(default_factory=list)
    standby: Optional[dict] = None
    faults: list[dict] = field(default_factory=list)
    # A finished job's summary.json in brief (how it ended, what ran without a controller).
    ended: Optional[str] = None
    # The newest good checkpoint and its age, failed saves and loads, quarantined copies.
    checkpoints: Optional[str] = None
    # Groups named stragglers (controller.stragglers), one line each, and hosts left out of placements.
    stragglers: list[str] = field(default_factory=list)
    excluded_hosts: dict[str, str] = field(default_factory=dict)


def _newest_step(layout: RunLayout, group: int, attempt: int, ranks: int) -> tuple[int, Optional[float]]:
    """The group's newest step and rank 0's loss from its reports (newer than controller.json
    while no controller is attached). Reads the tail of each report only."""
    step, loss = -1, None
    for r in range(ranks):
        for rec in tail_records(layout.report(group, r, attempt), 16384):
            if rec.get("type") == "step":
                step = max(step, rec["step"] + (1 if rec.get("committed") else 0))
                if r == 0 and rec.get("loss") is not None:
                    loss = rec["loss"]
    return step, loss


def _first_line_at(f, pos: int) -> Optional[tuple[int, float]]:
    """(offset, time) of the first whole record starting at or after byte ``pos``; None past the end."""
    f.seek(pos)
    if pos:
        f.readline()  # the rest of the line ``pos`` falls in
    while True:
        start, line = f.tell(), f.readline()
        if not line:
            return None
        try:
            return start, float(json.loads(line)["time"])
        except (ValueError, KeyError, TypeError):
            continue


def _offset_near(path: str, t: float) -> int:
    """A byte offset at or before the first record at or after time ``t`` in a rank's report
    (a rank writes its records in time order): found by bisection, so a long report is not read."""
    with open(path, "rb") as f:
        lo, hi = 0, os.path.getsize(path)
        while hi - lo > 65536:
            mid = (lo + hi) // 2
            found = _first_line_at(f, mid)
            if found is None or found[1] >= t:
                hi = mid
            else:
                lo = mid
        return lo


def _is_commit(r: dict) -> bool:
    return r.get("type") == "step" and r.get("rank") == 0 and bool(r.get("committed"))


def _commit_before(layout: RunLayout, group: int, attempt: int, t: float) -> Optional[dict]:
    """Rank 0 of ``group``'s newest commit before ``t`` (its report of ``attempt``), read from
    the records just before ``t`` backwards, as far as it takes."""
    path = layout.report(group, 0, attempt)
    if not os.path.exists(path):
        return None
    end = min(os.path.getsize(path), _offset_near(path, t) + 65536)
    span = 65536
    while True:
        start = max(0, end - span)
        commits = [r for r in read_records(path, start, end) if _is_commit(r) and r["time"] < t]
        if commits or start == 0:
            return commits[-1] if commits else None
        span *= 4


def _attempt_at(events: list[dict], group: int, t: float) -> int:
    """``group``'s attempt at time ``t`` (its newest launch before it)."""
    return max((e.get("attempt", 0) for e in events if e["event"] == EventKind.GROUP_LAUNCHED and e.get("group") == group and e["time"] <= t), default=0)


def mttr_of(layout: RunLayout, state: dict, fault: dict, events: list[dict]) -> Optional[float]:
    """Seconds from a fault to its recovery, by monarch_ft.records.recovered's rule (the drill's and its
    report's); None while it is not recovered.

    An injected fault: the drill's injector applied the rule (its ``fault_recovered``). A
    failure the controller saw (a group failed, the controller or the Lighthouse lost): the
    rule on the group's own report files, read around the failure only. For a control-plane
    failure the group is the first that had committed before it. Weights are not compared
    here (the other ranks' reports are not read): unknown, which does not count against it.
    """
    t = fault["time"]
    if fault["event"] == EventKind.FAULT_INJECTED:
        done = [e for e in events if e["event"] == EventKind.FAULT_RECOVERED and e.get("fault_id") == fault.get("fault_id") and e["time"] >= t]
        return done[0]["seconds"] if done else None
    rule = SEEN_FAILURES[EventKind(fault["event"])]
    groups = [g["index"] for g in state.get("groups", [])]
    if fault.get("group") is not None:
        candidates = [(fault["group"], fault.get("attempt", _attempt_at(events, fault["group"], t)))]
    else:
        candidates = [(g, _attempt_at(events, g, t)) for g in groups]
    for group, attempt in candidates:
        before = _commit_before(layout, group, attempt, t)
        if before is None and fault.get("group") is None:
            continue  # a group that had not committed yet shows nothing
        failure = Failure.after_commit(t, group, attempt, before, groups)
        since = marker_time(failure, rule, events)
        if since is None:
            return None
        current = next((g["attempt"] for g in state.get("groups", []) if g["index"] == group), attempt)
        seen: list[dict] = []
        for a in range(attempt + 1 if rule.new_attempt else attempt, current + 1):
            path = layout.report(group, 0, a)
            if not os.path.exists(path):
                continue
            for r in read_records(path, _offset_near(path, since)):
                if _is_commit(r):
                    seen.append(r)
                    if is_back(failure, rule, r, since):
                        return recovery(failure, rule, events, seen).mttr_s
        return None
    return None


def job_status(run_dir: str, now: Optional[float] = None) -> JobStatusView:
    now = now or time.time()
    layout, state = open_run(run_dir)
    events = read_jsonl(layout.events)
    pid = controller_attached(layout)
    beat = heartbeat_time(layout.controller_heartbeat)
    status = str(state.get("status"))
    if not state.get("finished") and pid is None:
        status = "running unsupervised" if _live_ranks(state) else "ended unsupervised"
    lh = state.get("lighthouse", {})
    lh_alive = bool(lh.get("server_pid")) and ProcessIdentity(lh["server_pid"], lh.get("server_start")).alive()
    view = JobStatusView(
        run_dir=layout.run_dir,
        status=status,
        controller_pid=pid,
        heartbeat_age_s=round(now - beat, 1) if beat and not state.get("finished") else None,
        lighthouse=f"{lh.get('address', '?')} ({'up' if lh_alive else 'down'})",
        job_step=int((state.get("ledger") or {}).get("job_step", 0)),
    )
    for g in state.get("groups", []):
        ranks = g.get("ranks", [])
        alive = sum(1 for r in ranks if r.get("pid") and ProcessIdentity(r["pid"], r["start"]).alive())
        step, loss = _newest_step(layout, g["index"], g["attempt"], len(ranks))
        loss = loss if loss is not None else g.get("last_loss")
        view.groups.append(
            GroupView(
                g["index"], g["status"], g["attempt"], max(step, g["last_step"]), loss, g["restarts"], alive, len(ranks), g.get("gave_up"), g.get("last_error")
            )
        )
        view.job_step = max(view.job_step, step)
    paths = [e for e in events if e["event"] == EventKind.RECOVERY_PATH]
    if paths or any(e["event"].startswith("standby") for e in events):
        view.standby = {
            "recoveries": {p.value: sum(1 for e in paths if e.get("path") == p.value) for p in RecoveryPath},
            "ready": [e.get("group", e.get("standby")) for e in events if e["event"] == "standby_ready"][-4:],
        }
    summary = read_json(layout.summary) if state.get("finished") else None
    if summary:
        ctl = summary.get("controller") or {}
        spans = ctl.get("unsupervised") or []
        unsup = f", {ctl.get('unsupervised_s', 0):.1f}s unsupervised ({sum(s.get('steps_committed', 0) for s in spans)} steps)" if spans else ""
        by = " (its lease ended it: no controller for controller.lease_s)" if ctl.get("ended_by_lease") else ""
        view.ended = (
            f"{summary['status']}{by}, job step {summary.get('job_step')}, steps lost {summary.get('steps_lost')}, "
            f"weights consistent {summary.get('weights_consistent')}{unsup}: {layout.summary}"
        )
    health = CheckpointHealth.from_events(events)
    if health.newest_good or health.save_failures or health.load_failures or health.quarantined:
        view.checkpoints = health.describe(now)
    view.stragglers = straggler_lines(events)
    view.excluded_hosts = dict(state.get("excluded_hosts") or {})
    for e in [e for e in events if e["event"] in _FAULT_KINDS][-5:]:
        view.faults.append(
            {
                "time": e["time"],
                "event": e["event"],
                "what": e.get("kind") or e.get("reason") or e["event"],
                "group": e.get("target", e.get("group")),
                "mttr_s": mttr_of(layout, state, e, events),
            }
        )
    return view


def straggler_lines(events: list[dict]) -> list[str]:
    """The groups named stragglers (``straggler_detected``), newest last, each with what became
    of it: still slow, kept (and why), evicted, or back to its peers' pace."""
    lines: dict[tuple[int, int], str] = {}
    current: dict[int, tuple[int, int]] = {}
    for e in events:
        kind, group = e["event"], e.get("group")
        if kind == EventKind.STRAGGLER_DETECTED:
            key = current[group] = (group, int(e.get("attempt") or 0))
            head = f"group {group} (attempt {key[1]}) {e['slow_kind']} straggler, {e['ratio']}x its peers: rank {e['rank']} "
            if e.get("probe_bytes"):
                # A link straggler: its probe's time for the payload (the slower way), at step.
                probe = f"{e['seconds']:.3f} s per {e['probe_bytes'] >> 10} KiB ({e.get('mbit_s')} Mbit/s)"
                lines[key] = head + f"{probe}, median {e['median_s']:.4f} s, step {e['steps'][0]}"
            else:
                lines[key] = head + f"{e['seconds']:.3f} s/step, median {e['median_s']:.3f} s, steps {e['steps'][0]}-{e['steps'][1]}"
        elif group in current and current[group] in lines:
            key = current[group]
            if kind == EventKind.STRAGGLER_KEPT:
                lines[key] = lines[key].split(": kept", 1)[0] + f": kept, {e['because']}"
            elif kind == EventKind.STRAGGLER_EVICTED:
                lines[key] = lines[key].split(": kept", 1)[0] + f": evicted, {e['because']}"
                del current[group]
            elif kind == EventKind.STRAGGLER_CLEARED:
                lines[key] += ": back to its peers' pace"
                del current[group]
    return list(lines.values())[-5:]


def format_status(v: JobStatusView) -> str:
    ctl = f"attached (pid {v.controller_pid})" if v.controller_pid else "none attached"
    beat = f", last heartbeat {v.heartbeat_age_s:.1f}s ago" if v.heartbeat_age_s is not None else ""
    lines = [
        f"job {v.run_dir}: {v.status}, job step {v.job_step}",
        f"controller: {ctl}{beat}",
        f"lighthouse: {v.lighthouse}",
        "group  state            attempt  step   loss     restarts  ranks alive",
    ]
    for g in v.groups:
        loss = f"{g.loss:.3f}" if g.loss is not None else "-"
        lines.append(f"{g.index:<6} {g.state:<16} {g.attempt:<8} {g.step:<6} {loss:<8} {g.restarts:<9} {g.ranks_alive}/{g.ranks}")
    for g in v.groups:
        if g.gave_up:
            crash = g.gave_up == GiveUpReason.CRASH_LOOP
            why = "a crash loop: its last two launches failed the same way at start-up" if crash else "its restart budget is spent"
            err = g.last_error or {}
            where = f" (at {err['frame']})" if err.get("frame") else ""
            lines.append(f"group {g.index} given up, {why}" + (f": {err['error']}{where}" if err.get("error") else ""))
    if v.ended is not None:
        lines.append(f"summary: {v.ended}")
    if v.checkpoints is not None:
        lines.append(f"checkpoints: {v.checkpoints}")
    if v.standby is not None:
        lines.append(f"standby: recoveries by path {v.standby['recoveries']}, ready {v.standby['ready']}")
    if v.stragglers:
        lines.append("stragglers:")
        lines += [f"  {line}" for line in v.stragglers]
    for host, why in v.excluded_hosts.items():
        lines.append(f"host {host} left out of placements: {why}")
    given_up = {g.index for g in v.groups if g.gave_up}
    if v.faults:
        lines.append("last faults:")
        for f in v.faults:
            mttr = f"mttr {f['mttr_s']:.1f}s" if f["mttr_s"] is not None else "not recovered yet"
            if f["event"] == EventKind.CONTROLLER_LOST and f["mttr_s"] is None and v.status == JobStatus.LEASE_EXPIRED:
                mttr = "no controller came back: the lease ended the job"
            if f["event"] == EventKind.GROUP_FAILED and f["mttr_s"] is None and f["group"] in given_up:
                mttr = "not recovered: the group was given up"
            when = time.strftime("%H:%M:%S", time.localtime(f["time"]))
            group = f" group {f['group']}" if f["group"] is not None else ""
            lines.append(f"  {when} {f['event']} {f['what']}{group}: {mttr}")
    return "\n".join(lines)


def _live_ranks(state: dict) -> dict[str, tuple[ProcessIdentity, str]]:
    """Label (``g<G>r<R>``) -> (identity, log file) of every recorded rank that still runs."""
    out = {}
    for g in state.get("groups", []):
        for r in g.get("ranks", []):
            ident = ProcessIdentity(r["pid"], r["start"]) if r.get("pid") else None
            if ident is not None and ident.alive():
                out[f"g{g['index']}r{r['launch']['rank']}"] = (ident, r["launch"].get("log_path", ""))
    return out


def job_stacks(run_dir: str, group: Optional[int] = None) -> dict[str, str]:
    """Every live rank's Python stacks (py-spy; the rank's faulthandler, copied from its log,
    where py-spy cannot read it: monarch_ft.common.stacks) into ``stacks/cli-<ms>/``; label -> file."""
    layout, state = open_run(run_dir)
    ranks = _live_ranks(state)
    if group is not None:
        groups = {g["index"] for g in state.get("groups", [])}
        if group not in groups:
            raise ConfigError(f"--group {group}: no such group (the job has groups {sorted(groups)})")
        ranks = {k: v for k, v in ranks.items() if k.startswith(f"g{group}r")}
    if not ranks:
        raise ConfigError(f"{run_dir}: no live rank{' in group ' + str(group) if group is not None else ''}: the job is not running")
    pids = {label: ident.pid for label, (ident, _) in ranks.items()}
    logs = {label: log for label, (_, log) in ranks.items() if log}
    return capture_stacks(pids, layout.stacks_capture("cli", time.time()), logs=logs)


def job_stop(run_dir: str, timeout_s: float = 120.0, echo=print) -> int:
    """Stop the job cleanly: every group finishes at one step just ahead of the job's, saves
    its checkpoint there and exits 0. The controller, if one is attached, names the step
    and ends the job as completed (summary.json); with none, the ranks do it themselves
    (rank.components.lease) and the Lighthouse follows. (Ctrl-C on the controller is the hard
    stop.) Returns how many ranks were still alive at the timeout."""
    layout, state = open_run(run_dir)
    if state.get("finished"):
        raise ConfigError(f"{run_dir}: the job has already finished ({state.get('status')})")
    pid = controller_attached(layout)
    atomic_write(layout.stop_request, str(time.time()))
    who = f"the controller (pid {pid}) finishes the job" if pid else "no controller attached: the ranks finish"
    echo(f"stop requested: {who} at a common step, with a checkpoint")
    deadline = time.time() + timeout_s
    left: dict[str, Any] = {}
    while time.time() < deadline:
        now_state = layout.read_controller_state() or state
        left = _live_ranks(now_state)
        # With no controller, the job's end (summary.json) is written by its last process (monarch_ft.controller.closeout).
        if not left and (pid is None or controller_attached(layout) is None) and (pid is not None or now_state.get("finished")):
            echo("the job has stopped")
            return 0
        time.sleep(0.5)
    echo(f"still running after {timeout_s:.0f}s: {', '.join(sorted(left)) or ('the controller' if pid else 'the close-out (summary.json)')}")
    return len(left) or 1


def verify_checkpoints(run_dir: str) -> tuple[list[str], int]:
    """Every checkpoint step on disk of every group, checked against its manifest: one line
    per step (and per quarantined copy, with why), and how many are damaged.

    A step without a manifest is a save that did not finish (or one written before
    manifests): never loaded, so listed as incomplete, not damaged. Quarantined copies are
    listed for the record; they are out of the job's way already."""
    layout, state = open_run(run_dir)
    config = state.get("config") or {}
    layout = RunLayout(run_dir, (config.get("checkpoint") or {}).get("folder", "checkpoint"))
    groups = int((config.get("ft") or {}).get("replica_groups", 0))
    lines, damaged = [], 0
    for g in range(groups):
        folder = layout.checkpoint(g)
        for step in steps_on_disk(folder):
            path = step_dir(folder, step)
            name = os.path.basename(path)
            if not os.path.isfile(os.path.join(path, MANIFEST)):
                lines.append(f"group {g} {name}: incomplete: no {MANIFEST} (a save that did not finish, or one from before manifests): never loaded")
                continue
            problem = verify_step(path)
            if problem is None:
                files = read_json(os.path.join(path, MANIFEST))["files"]
                size = sum(f["size"] for f in files.values())
                lines.append(f"group {g} {name}: intact ({len(files)} files, {size / 1e6:.1f} MB)")
            else:
                damaged += 1
                lines.append(f"group {g} {name}: DAMAGED: {problem}")
        for path, why in quarantined(folder):
            lines.append(f"group {g} {os.path.relpath(path, folder)}: quarantined: {why.get('reason', 'no reason recorded')}")
    if not lines:
        lines.append(f"no checkpoint on disk under {layout.checkpoint_root}")
    return lines, damaged
