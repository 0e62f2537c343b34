"""How a job ended, as the controller reports it (``summary.json`` and the console's last lines)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from monarch_ft.controller.state import JobState
from monarch_ft.records.events import GroupStatus, JobStatus


def job_outcome(group_statuses: Sequence[str], regressed: bool) -> JobStatus:
    """How a job ended once every group is done or given up.

    Regressed first (a commit went below the job's step: its weights are suspect whatever
    else happened); completed when every group finished; failed when none did (every group
    gave up: nothing trained to the end, so calling it degraded would hide a dead job);
    degraded when some finished and some gave up.

    Args:
        group_statuses: every group's :class:`GroupStatus`.
        regressed: some commit went back (``step_regression``).
    """
    if regressed:
        return JobStatus.REGRESSED
    if all(s == GroupStatus.DONE for s in group_statuses):
        return JobStatus.COMPLETED
    if not any(s == GroupStatus.DONE for s in group_statuses):
        return JobStatus.FAILED
    return JobStatus.DEGRADED


def rollback_lines(rollbacks: list[dict]) -> list[str]:
    """The console's end-of-job lines for the job's rollbacks: one per distinct rollback, with
    how many times it happened, so a group that crash-loops back to the same checkpoint
    reads as one line with a count, never as the same line again and again."""
    counts: dict[tuple, int] = {}
    for r in rollbacks:
        key = (r["steps_lost"], r["from_step"], r["to_step"], r["reason"])
        counts[key] = counts.get(key, 0) + 1
    lines = []
    for (lost, frm, to, reason), n in counts.items():
        times = f", {n} times" if n > 1 else ""
        lines.append(
            f"the job went back {lost} committed steps: from step {frm} to its checkpoint at step {to}{times} ({reason}: no group held the job's state)"
        )
    return lines


def job_summary(state: JobState, cfg: Any, launcher: dict, lighthouse: str, standby: dict, controller: dict, now: float) -> dict[str, Any]:
    """``summary.json``: how the job ended, group by group.

    Args:
        state: the job's state at its end.
        cfg: the job's config (a dataclass).
        launcher: the launcher's own description (``Launcher.describe``).
        lighthouse: the Lighthouse's address.
        standby: the standby pool's summary (``StandbyPoolState.summary``).
        controller: its controllers and the spans without one (``Takeover.summary``).
        now: the end's time.
    """
    controller = {**controller, "watch_loop": state.watch.cost.as_dict()}
    hashes_by_rank: dict[int, dict[int, Optional[str]]] = {}
    groups = {}
    for g in state.groups:
        for rs in g.ranks:
            hashes_by_rank.setdefault(rs.rank, {})[g.index] = rs.state_hash
        groups[str(g.index)] = {
            "status": g.status,
            "restarts": g.restarts,
            "attempts": g.attempt + 1,
            # Why it was given up (GiveUpReason; None: it was not), and its latest failure's error.
            "gave_up": g.gave_up,
            "last_error": g.last_error,
            "final_step": g.last_step,
            "first_loss": g.first_loss,
            "last_loss": g.last_loss,
            "state_hashes": {str(rs.rank): rs.state_hash for rs in g.ranks},
        }
    done = [g.index for g in state.groups if g.status == GroupStatus.DONE]
    consistent = bool(done) and all(len({h.get(i) for i in done}) == 1 and h.get(done[0]) is not None for h in hashes_by_rank.values())
    return {
        "status": state.status,
        "run_dir": state.run_dir,
        "wall_time_s": round(now - state.started, 3) if state.started else 0.0,
        "replica_groups": cfg.ft.replica_groups,
        "ranks_per_group": cfg.ft.ranks_per_group,
        "steps": cfg.training.steps,
        **launcher,
        "transport": cfg.ft.transport,
        "lighthouse": lighthouse,
        "restarts": sum(g.restarts for g in state.groups),
        "weights_consistent": consistent,
        # The job's committed steps at the end; what it gave up going back to a checkpoint
        # when no group held its state (each rollback listed); commits below the job's
        # step (a group that trained on a stale state: status "regressed").
        "job_step": state.job_step,
        "steps_lost": sum(r["steps_lost"] for r in state.rollbacks),
        "rollbacks": state.rollbacks,
        "step_regressions": state.regressions,
        # Steps committed again by a later quorum with other weights (controller.ledger.redone_commit).
        "steps_redone": state.steps_redone,
        "full_restarts": state.full_restarts,
        # Failed saves (by errno), the newest good checkpoint and its age, failed loads and
        # quarantined copies (controller.checkpoints.CheckpointHealth).
        "checkpoint": state.ckpt_health.as_dict(now),
        # Warm standby groups: launched, promoted, lost, and time with none ready.
        "standby": standby,
        # Its controllers and the spans it ran without one (monarch_ft.controller.takeover);
        # what the watch loop cost this controller process (WatchCost).
        "controller": controller,
        # A cluster's nodes: every exclusion and its return, placements (controller.placement).
        "nodes": state.nodes.summary(),
        "groups": groups,
        "config": dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else None,
    }
