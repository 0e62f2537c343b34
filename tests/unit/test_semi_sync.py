"""SemiSync's decisions around a sync (rank.components.sync), driven through torchft's own LocalSGD
with a Manager whose quorums are scripted: what a relaunched group does when its join's quorum
fails, and which step a sync that healed the group records.

The fake stands in for MonarchManager only where a real one needs peers (a Lighthouse, other
groups' processes): each quorum's outcome (a heal to the peers' step, or a failure) is given
up front; the job tests (tests/jobs/test_sync_modes_jobs.py) run the real thing."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torchft.work import _DummyWork

from monarch_ft.config.ft import FTConfig
from monarch_ft.rank.components.ft import CommitFloor
from monarch_ft.rank.components.sync import LocalSGDSync

WINDOW = 10


class ScriptedManager:
    """The Manager surface SemiSync and torchft's LocalSGD drive. Each ``start_quorum`` takes the
    next outcome: ``heal_to`` (the peers' step: this group heals to it) and/or ``error`` (the
    quorum failed: no heal, no commit). A sync commits when its quorum did not fail."""

    def __init__(self, outcomes: list[dict]) -> None:
        self.outcomes = list(outcomes)
        self.step = 0
        self.heals = 0
        self.quorums = 0
        self.failed = False
        self.past_finish = None
        self.served_past_finish = False
        self.count_healing = True
        self.sync_trace = None
        self.before_commit = None

    def start_quorum(self, timeout=None, **kwargs) -> None:
        self.quorums += 1
        outcome = self.outcomes.pop(0)
        self.failed = outcome.get("error", False)
        if outcome.get("heal_to") is not None and not self.failed:
            self.step, self.heals = outcome["heal_to"], self.heals + 1

    def wait_quorum(self) -> None:
        pass

    def current_step(self) -> int:
        return self.step

    def errored(self) -> Optional[Exception]:
        return RuntimeError("the quorum timed out") if self.failed else None

    def allreduce(self, tensor: torch.Tensor, *args, **kwargs):
        return _DummyWork(tensor)

    def should_commit(self, timeout=None) -> bool:
        if self.before_commit is not None:
            self.before_commit()
        if self.failed:
            return False
        self.step += 1
        return True

    def take_served_past_finish(self) -> bool:
        served, self.served_past_finish = self.served_past_finish, False
        return served

    def allow_state_dict_read(self) -> None:
        pass

    def disallow_state_dict_read(self) -> None:
        pass


def _sync(tmp_path, manager: ScriptedManager) -> LocalSGDSync:
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Schedulers:
        schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)]

    cfg = FTConfig(replica_groups=3, mode="localsgd", sync_every=WINDOW)
    floor = CommitFloor(str(tmp_path / "commit_floor"))
    return LocalSGDSync(manager, model, optimizer, Schedulers(), dict(model.named_parameters()), cfg, 1, floor=floor, refuse=lambda *a: None)


def _step(sync: LocalSGDSync, trained: list[int]):
    def forward_backward(pos: int) -> torch.Tensor:
        trained.append(pos)
        loss = sync.model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    return sync.step(True, 10**6, forward_backward, lambda: None, lambda: None, lambda phase: None)


def test_a_join_whose_quorum_fails_before_it_heals_joins_again_and_trains_nothing_meanwhile(tmp_path):
    """The order of a stress run at 56fef4b: a standby promoted for group 1 joined a quorum that
    also held the group's dead attempt (it asked for that quorum, then died); the quorum failed
    after ft.timeout_s, before the join healed. The group then trained a window from its initial
    weights, healed at that window's sync and recorded the sync as its step 9 while the job had
    committed 39 (status regressed). It joins again instead: no batch trained until it healed."""
    manager = ScriptedManager([{"error": True}, {"heal_to": 4}])
    sync, trained = _sync(tmp_path, manager), []
    sync.join_pending = True

    failed = _step(sync, trained)
    assert failed is not None and not failed.committed and sync.join_pending
    joined = _step(sync, trained)
    assert trained == [], "no window trained on a state the group never had"
    assert joined.committed and joined.healed and joined.step == 5 * WINDOW - 1
    assert not sync.join_pending and sync.position() == 5 * WINDOW


def test_a_sync_that_heals_a_group_behind_by_syncs_records_the_sync_point_it_reached(tmp_path):
    """A group held up for two syncs (a slow save) comes to its own sync at step 9, heals there to
    the peers' step 3 and the sync commits: its record says 39, the sync point the job reached,
    not 9 (a commit below the job's step, read by the supervisor as a regression)."""
    manager = ScriptedManager([{"heal_to": 3}])
    sync, trained = _sync(tmp_path, manager), []
    results = [_step(sync, trained) for _ in range(WINDOW)]
    assert trained == list(range(WINDOW))
    last = results[-1]
    assert last.committed and last.healed and last.step == 4 * WINDOW - 1 and last.batch == WINDOW - 1
    assert not any(r.committed for r in results[:-1])
