"""When the groups waiting at a shared start gate may train (the first launch, a full restart)."""

from __future__ import annotations


def start_gate_opens(all_ready: bool, waited_s: float, startup_timeout_s: float) -> bool:
    """Whether a shared start gate (first launch, full restart) lets its groups train.

    Once every group at it has built its model and loaded its state, so they start as one
    quorum; or after half the startup timeout, so a group that cannot start does not hold
    the others (it is left to its own startup timeout).

    Args:
        all_ready: every group waiting at the gate reported model_ready on every rank.
        waited_s: seconds since the gate's generation began.
        startup_timeout_s: ``ft.startup_timeout_s``.
    """
    return all_ready or waited_s > startup_timeout_s / 2
