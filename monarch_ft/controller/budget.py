"""How often a failed group is relaunched: the restart budget (a rate) and crash loops.

Pure decisions, applied by the watch loop (:mod:`monarch_ft.controller.loop`): how many
relaunches a group had within ``ft.restart_window_s``, the backoff before its next one (or
that its budget is spent), and whether its last two launches failed the same way at
start-up (a crash loop: given up whatever the budget).
"""

from __future__ import annotations

from typing import Optional, Sequence


def recent_restarts(restart_times: Sequence[float], now: float, window_s: float) -> int:
    """How many of a group's relaunches happened within the last ``window_s`` seconds.

    The restart budget is a rate, not a lifetime count: ``ft.max_restarts`` within any
    ``ft.restart_window_s``. Over a job's whole life, a multi-day run would give up on a
    group at its fourth ordinary fault, days apart; a group that keeps failing does so within
    minutes of each relaunch, so it still spends the budget inside one window.

    Args:
        restart_times: when the group was relaunched (wall-clock seconds; any order).
        now: the time of the failure being judged.
        window_s: ``ft.restart_window_s``.
    """
    return sum(1 for t in restart_times if now - t < window_s)


def restart_backoff(restarts_done: int, max_restarts: int, backoff_s: float, backoff_max_s: float) -> Optional[float]:
    """Seconds before a failed group's next launch, or None: its restart budget is spent (give up).

    Doubling from ``backoff_s`` up to ``backoff_max_s``: a group that fails at once on
    every launch (a broken host, a bug) neither spins nor waits long after a one-off fault.

    Args:
        restarts_done: times this group was already relaunched within the budget's window
            (:func:`recent_restarts`): the backoff follows recent failures, so a fault an hour
            after the last one waits ``backoff_s`` again, not the doubled wait of the past.
        max_restarts: ``ft.max_restarts``.
        backoff_s, backoff_max_s: ``ft.restart_backoff_s``, ``ft.restart_backoff_max_s``.
    """
    if restarts_done >= max_restarts:
        return None
    return min(backoff_s * 2**restarts_done, backoff_max_s)


def startup_failure(stepped: bool, errors: Sequence[dict]) -> Optional[dict]:
    """A group attempt's failure at start-up, as the controller compares it between relaunches; else None.

    Start-up: the attempt never stepped (its config, data, model build, checkpoint load or
    first forward failed). The group's error is its ranks' earliest ``rank_error`` (the
    others often fail because of that one: a peer gone from a collective). None when the
    attempt had stepped, no rank reported an error (killed by a signal, or a deliberate exit
    with its own code, such as a refused commit or a checkpoint set aside), or the earliest
    error is environmental (:func:`error_record`).

    Args:
        stepped: some rank of the attempt reported a step (or finished).
        errors: the attempt's ``rank_error`` records (with ``time``, ``rank``).
    """
    if stepped or not errors:
        return None
    first = min(errors, key=lambda e: e.get("time") or 0.0)
    if first.get("environmental"):
        return None
    return {k: first.get(k) for k in ("error", "error_type", "frame", "rank", "attempt")}


def crash_loop(previous: Optional[dict], current: Optional[dict]) -> bool:
    """The group's last two launches failed the same way at start-up: relaunching it again
    would only fail again, so it is given up after the second such failure (not after
    ``ft.max_restarts`` of them) and its error goes to the console.

    The same way: the same exception type and innermost frame (not the message, which may
    hold a port, a pid or a time).

    Args:
        previous: :func:`startup_failure` of the attempt before (None: it stepped, or failed otherwise).
        current: :func:`startup_failure` of the attempt that just failed.
    """
    if previous is None or current is None:
        return False
    return (previous["error_type"], previous["frame"]) == (current["error_type"], current["frame"])


def crash_loop_line(group: int, failure: dict, log_path: str) -> str:
    """The console's one line for a crash loop (controller.budget.crash_loop): the ranks' own error
    line and where it was raised, that relaunching is over, and what to fix."""
    where = f" (at {failure['frame']})" if failure.get("frame") else ""
    return (
        f"group {group} failed the same way on its last two launches, before its first step: {failure.get('error')}{where}; "
        f"it is not relaunched: fix the config or the data this names and run again (traceback: {log_path})"
    )
