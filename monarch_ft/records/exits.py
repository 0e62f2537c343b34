"""How a rank ends: the exit codes it ends with on purpose, and an exit as the event log names it.

The rank exits with these codes (monarch_ft.rank), the controller reads them back through
its launcher's process handles and names them in ``rank_exited`` / ``group_failed``.
"""

from __future__ import annotations

import signal
from enum import IntEnum
from typing import Optional

# An adopted rank (not this controller's child) has no exit status to read: one that
# is gone without having reported rank_finished is taken for a crash with this code. So is
# a Slurm task that vanished with its node (monarch_ft.launcher.slurm): "lost" in events.
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
    if code == LOST_EXIT:
        return {"exit_code": code, "exit_reason": "lost"}
    return {"exit_code": code}


def blamed_exit(exits: list[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """Which of the ranks found exited non-zero in one look at a group failed it: ``(rank, code)``.

    Why not simply the lowest rank: when one rank dies, its group peers fail their next
    collective and exit 1 a moment later, and the controller often sees both exits in the
    same look (the ranks a fork server forked report their exits through it, a few ms late:
    a SIGKILLed rank 1 was once blamed on its peer's ``exit_code=1``). A rank killed by a
    signal is a cause, never a consequence; a deliberate :class:`RankExit` (a checkpoint that
    would not load, a commit below the floor) says why; any other code is likeliest the
    peers' broken collective. Ties: the lowest rank.

    Args:
        exits: ``(rank, exit code)`` of each rank found exited non-zero (codes < 0: signals).
    """

    def order(item: tuple[int, int]) -> tuple[int, int]:
        rank, code = item
        return (0 if code < 0 else 1 if code in RankExit._value2member_map_ else 2, rank)

    return min(exits, key=order) if exits else None
