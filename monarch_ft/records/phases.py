"""What a rank's main thread is doing: the rank reports it, the controller's hang model judges by it."""

from __future__ import annotations

from monarch_ft.records.events import StrEnum


class Phase(StrEnum):
    """What a rank's main thread is doing; its liveness thread reports it every beat.

    The hang detector judges a rank by its phase: a long save, a wait for a quorum while
    a peer heals or saves, are not hangs within their own budgets (see HangLimits).
    """

    STARTUP = "startup"  # building the model, loading state
    GATE = "gate"  # waiting at a start or launch gate
    COMPUTE = "compute"  # forward, backward, optimizer step
    SYNC = "sync"  # TorchFT: quorum, cross-group allreduce, should_commit (bounded by its timeouts)
    SAVE = "save"  # a checkpoint save (bounded by its own watchdog)
    HOLD = "hold"  # finished, serving quorums while another group has work
    STANDBY = "standby"  # a warm standby waiting for its promotion (never a replica group's phase)
