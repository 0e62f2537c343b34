"""What happened to each fault of a drill, in words a person can act on (pure decisions).

A drill's fault either fired or did not. One that did not is *not injected*, with the
reason and the fix, never "recovered=False, mttr=None": the injector fires faults one at a
time, each when its trigger is reached, the previous one has recovered and its target is
healthy, so a job can end (reach ``training.steps``) before a fault's turn comes. One that
fired and recovered names its recovery path (:class:`~monarch_ft.records.events.RecoveryPath`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from monarch_ft.records.events import EventKind, RecoveryPath, StrEnum


class NotInjected(StrEnum):
    """Why a fault never fired (the injector's last reason for holding it back)."""

    PREVIOUS_NOT_RECOVERED = "previous_not_recovered"  # an earlier fault was still recovering
    NOT_DUE = "not_due"  # its trigger (at_step / at_s) was never reached
    NO_HEALTHY_TARGET = "no_healthy_target"  # its target group was not stepping, or it was the last one
    QUEUED = "queued"  # an earlier fault never fired, and faults fire in order
    JOB_STOPPING = "job_stopping"  # the job was asked to stop (python -m monarch_ft stop) before it was due


def blocked_reason(active_id: Optional[int], due: bool, target_ok: bool) -> Optional[NotInjected]:
    """What holds the next fault back at a tick (None: it fires now). The injector's order."""
    if active_id is not None:
        return NotInjected.PREVIOUS_NOT_RECOVERED
    if not due:
        return NotInjected.NOT_DUE
    if not target_ok:
        return NotInjected.NO_HEALTHY_TARGET
    return None


def explain_not_injected(fault: dict, blocked: Optional[dict], steps: int, job_step: int) -> dict[str, Any]:
    """``{"reason", "detail", "fix"}`` for a fault that never fired.

    Args:
        fault: the fault's config as a dict (``id``, ``kind``, ``at_step``/``at_s``, ``target``).
        blocked: the injector's last record of what held it back (``reason`` a
            :class:`NotInjected`, ``previous`` the fault still recovering, ``healthy`` the
            healthy groups, ``first_pending`` the earlier fault that never fired), or None
            if its turn never came.
        steps: ``training.steps``.
        job_step: the job's committed step when it ended.
    """
    blocked = blocked or {}
    reason = NotInjected(blocked.get("reason", NotInjected.QUEUED))
    trigger = f"at_step={fault['at_step']}" if fault.get("at_step") is not None else f"at_s={fault.get('at_s')}"
    ended = f"the job ended at step {job_step} of training.steps={steps}"
    if reason is NotInjected.PREVIOUS_NOT_RECOVERED:
        prev = blocked.get("previous")
        detail = f"{ended} while fault {prev} was still recovering (faults fire one at a time)"
        fix = f"raise training.steps (the job must outlast fault {prev}'s recovery) or space the faults further apart"
    elif reason is NotInjected.NOT_DUE:
        detail = f"{ended} before the fault's trigger {trigger}"
        fix = f"raise training.steps above {fault['at_step']}" if fault.get("at_step") is not None else "lower at_s or raise training.steps"
        if fault.get("at_step") is not None:
            fix += f" or move at_step below {job_step}"
    elif reason is NotInjected.JOB_STOPPING:
        detail = f"the job was asked to stop (python -m monarch_ft stop) before its trigger {trigger}; {ended}"
        fix = "stop the job later, or move the fault earlier"
    elif reason is NotInjected.NO_HEALTHY_TARGET:
        healthy = list(blocked.get("healthy") or [])
        if fault.get("target") is not None and fault["target"] not in healthy:
            detail = f"{ended}; its target group {fault['target']} was not stepping in the quorum when it was due (healthy: {healthy})"
            fix = "drop target (a healthy group is drawn) or target a group that is stepping"
        else:
            detail = f"{ended}; only {len(healthy)} healthy group(s) were left when it was due, and the last one is never hit"
            fix = "raise ft.replica_groups or set chaos.allow_last_healthy=true"
    else:
        first = blocked.get("first_pending")
        which = f"fault {first}" if first is not None else "an earlier fault"
        detail = f"{ended}; {which} before it never fired (faults fire in order)"
        fix = f"make {which} fire first (see its fix)"
    return {"reason": reason.value, "detail": detail, "fix": fix}


def recovery_path(events: Sequence[dict], group: int, since: float, until: float, relaunched: bool) -> Optional[str]:
    """How the fault's target group came back: the first ``recovery_path`` event the supervisor
    wrote for it after the fault (standby, warm fork, cold start); a relaunch without one is
    a cold start (fresh interpreters, as a build without standby groups relaunches). None:
    nothing was relaunched (an in-place fault: TorchFT reconfigured without a restart)."""
    for e in sorted(events, key=lambda e: e["time"]):
        if e.get("event") == EventKind.RECOVERY_PATH.value and e.get("group") == group and since <= e["time"] < until:
            return str(e.get("path"))
    return RecoveryPath.COLD_START.value if relaunched else None


def explain_not_recovered(timed_out: bool, recovery_timeout_s: float, steps: int, job_step: int) -> dict[str, Any]:
    """``{"reason", "detail", "fix"}`` for a fault that fired but whose group was not back in
    the quorum: its recovery ran past ``chaos.recovery_timeout_s``, or the job ended first."""
    if timed_out:
        return {
            "reason": "recovery_timeout",
            "detail": f"the group was not back in the quorum within chaos.recovery_timeout_s={recovery_timeout_s:g}",
            "fix": "see the group's logs and events; raise chaos.recovery_timeout_s if it was only slow",
        }
    return {
        "reason": "job_ended",
        "detail": f"the job ended at step {job_step} of training.steps={steps} before the group was back in the quorum",
        "fix": "raise training.steps (the job must outlast the recovery) or move at_step earlier",
    }


def fix_line(faults: Sequence[dict]) -> Optional[str]:
    """One line for a drill whose faults did not all fire: the first one's fix, and how many."""
    missing = [f for f in faults if f.get("injected") is False]
    if not missing:
        return None
    f = missing[0]
    more = f" ({len(missing)} faults never fired)" if len(missing) > 1 else ""
    return f"fault {f['id']} ({f['kind']}) was not injected: {f['not_injected']['detail']}; {f['not_injected']['fix']}{more}"
