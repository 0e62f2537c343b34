"""The ranks' side of a Lighthouse restart (the supervisor restarts it on the same address).

What torchft 0.2.0's Managers do while their Lighthouse is gone (measured; see docs/design/lighthouse.md,
"The Lighthouse dies"): the Manager server's heartbeats fail and it reconnects on its own.
A quorum in flight fails at the server ("lighthouse quorum failed ... transport error"),
and with torchft's default ``quorum_retries=0`` the ranks waiting on it are never told:
they wait out ``ft.quorum_timeout_s`` and ``wait_quorum`` raises ``TimeoutError``, which
ends the rank. Two things keep the groups and their steps:

- :func:`quorum_retries`: the Manager server retries the failed quorum on a fresh
  connection (torchft's own ``Manager(quorum_retries=...)``), every
  :data:`QUORUM_RETRY_S` for as long as the quorum timeout lasts. The quorum in flight
  completes at the new Lighthouse about as soon as it listens.
- :meth:`LighthouseEpoch.quorum_id_offset`: a new Lighthouse numbers its quorums from 1
  again. torchft names the cross-group store prefix after the quorum id
  (``torchft/<quorum_id>/<rank>``) and reconfigures the process group only when the id
  changes, so a repeated id would rendezvous on an earlier quorum's stale keys or keep a
  stale group. The supervisor bumps ``control/lighthouse_epoch`` before it starts the new
  Lighthouse, and quorum ids are offset by ``epoch * EPOCH_STRIDE``. That is the same on
  every rank of every group, so ids stay unique and increasing (the supervisor's
  CommitLedger relies on that too). The Manager takes the offset through
  monarch_ft.rank.components.torchft_compat.offset_quorum_ids: torchft has no public seam for it.
"""

from __future__ import annotations

import math

from monarch_ft.records.layout import read_int

EPOCH_STRIDE = 1_000_000

# How often a Manager server retries a quorum its Lighthouse failed (connection refused
# while the supervisor restarts it): the quorum completes within this of the new Lighthouse
# listening. torchft spaces its retries evenly over the quorum's timeout (timeout / (retries + 1)).
QUORUM_RETRY_S = 0.25


def quorum_retries(quorum_timeout_s: float) -> int:
    """``Manager(quorum_retries=...)``: retries every :data:`QUORUM_RETRY_S` across the whole
    quorum timeout, so a Lighthouse restarted within it loses no group."""
    return max(1, math.ceil(quorum_timeout_s / QUORUM_RETRY_S))


class LighthouseEpoch:
    """How many times the job's Lighthouse was restarted (a control file; missing = 0).

    Args:
        path: ``RunLayout.lighthouse_epoch``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def current(self) -> int:
        return read_int(self.path)

    def quorum_id_offset(self) -> int:
        """What this epoch adds to every quorum id (0 before the first restart)."""
        return self.current() * EPOCH_STRIDE
