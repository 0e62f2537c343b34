"""How a rank ends: the exit codes it ends with on purpose, and an exit as the event log names it.

The rank exits with these codes (monarch_ft.rank), the controller reads them back through
its launcher's process handles and names them in ``rank_exited`` / ``group_failed``.
"""

from __future__ import annotations

import signal
from enum import IntEnum
from typing import Optional

# An adopted rank (not this controller's child) has no exit status to read: one that
# is gone without having reported rank_finished is taken for a crash with this code.
LOST_EXIT = 255


class RankExit(IntEnum):
    """Exit codes a rank ends with on purpose (anything else non-zero is a crash)."""

    OK = 0
    """A clean end: it trained every step, or ended with the job (the controller's lease ran out; a standby nobody will promote)."""
    COMMIT_BELOW_FLOOR = 75
    """It was about to commit a step below the job's committed step (rank.components.ft.CommitFloor)."""
    SAVE_TIMEOUT = 76
    """A checkpoint save outlived ``checkpoint.save_timeout_s`` (rank.components.checkpoint.SaveWatchdog)."""
    CHECKPOINT_LOAD_FAILED = 77
    """Loading a disk checkpoint raised (rank.trainer.Trainer.load_checkpoint): the controller
    quarantines that copy and decides again (an older step, or a live peer). Not an exception
    escaping the rank: a checkpoint that cannot be read is not a crash loop."""


def describe_exit(code: Optional[int]) -> dict:
    """Exit code -> {"exit_code": n} or {"signal": "SIGKILL"} for the event log, with the
    :class:`RankExit` name for a deliberate exit."""
    if code is None:
        return {}
    if code < 0:
        try:
            return {"signal": signal.Signals(-code).name, "exit_code": code}
        except ValueError:
            return {"signal": f"SIG{-code}", "exit_code": code}
    if code in RankExit._value2member_map_ and code != 0:
        return {"exit_code": code, "exit_reason": RankExit(code).name.lower()}
    return {"exit_code": code}
