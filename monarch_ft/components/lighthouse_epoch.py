"""The ranks' side of a Lighthouse restart (the supervisor restarts it on the same address).

What torchft 0.2.0's Managers do while their Lighthouse is gone (measured; see README,
"The job outlives its controller"): the Manager server's heartbeats fail and it
reconnects on its own; a quorum in flight fails at the server ("lighthouse quorum
failed ... tcp connect error") but the ranks waiting on it are never told: they wait out
``ft.quorum_timeout_s`` and ``wait_quorum`` raises ``TimeoutError``, which used to end the
rank, so every group restarted at once. Two things keep the groups and their steps:

- :meth:`LighthouseEpoch.changed_since`: a quorum that failed while the Lighthouse was
  restarted (the supervisor bumps ``control/lighthouse_epoch`` before it starts the new
  one) is reported to the Manager as an error instead: that step is not committed by
  anyone, and the next quorum goes to the new Lighthouse.
- :class:`EpochQuorumClient`: a new Lighthouse numbers its quorums from 1 again, and
  torchft names the cross-group store prefix after the quorum id
  (``torchft/<quorum_id>/<rank>``): a repeated id would rendezvous on an earlier
  quorum's stale keys. Quorum ids are offset by ``epoch * EPOCH_STRIDE``, the same on every
  rank of every group, so they stay unique and increasing (the supervisor's CommitLedger
  relies on that too).
"""

from __future__ import annotations

from typing import Any

from monarch_ft.run_layout import read_int

EPOCH_STRIDE = 1_000_000


class LighthouseEpoch:
    """How many times the job's Lighthouse was restarted (a control file; missing = 0).

    Args:
        path: ``RunLayout.lighthouse_epoch``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def current(self) -> int:
        return read_int(self.path)

    def changed_since(self, epoch: int) -> bool:
        return self.current() != epoch


class _OffsetQuorum:
    """A torchft QuorumResult with its quorum id moved into this Lighthouse epoch's range."""

    def __init__(self, result: Any, offset: int) -> None:
        self._result = result
        self.quorum_id = result.quorum_id + offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


class EpochQuorumClient:
    """torchft's ManagerClient, with quorum ids offset by the Lighthouse epoch (see above).

    Args:
        client: the Manager's ``ManagerClient``.
        epoch: the job's :class:`LighthouseEpoch`.
    """

    def __init__(self, client: Any, epoch: LighthouseEpoch) -> None:
        self._client = client
        self._epoch = epoch

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        result = self._client._quorum(*args, **kwargs)
        offset = self._epoch.current() * EPOCH_STRIDE
        return _OffsetQuorum(result, offset) if offset else result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
