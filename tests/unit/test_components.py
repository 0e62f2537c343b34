"""The rank-side pieces the drills exercise only in minutes-long runs, tested in milliseconds:
report files read while they are written, the cross-group gradient average, in-place heals."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch.distributed import ReduceOp

from monarch_ft.rank.components.ft import GradSync, Membership, Synced, load_in_place
from monarch_ft.rank.components.metrics import RankReporter
from monarch_ft.records.events import EventKind
from monarch_ft.rank.trainer import StopAt
from monarch_ft.records.layout import atomic_write, read_jsonl
from monarch_ft.records.reports import ReportTail


def test_report_tail_skips_a_torn_last_line_until_it_is_whole(tmp_path):
    path = tmp_path / "g0r0.a0.jsonl"
    tail = ReportTail(str(path))
    assert tail.read() == [], "no file yet: nothing, no error"
    whole = json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n"
    torn = json.dumps({"step": 3})[:5]
    path.write_text(whole + torn)
    assert [r["step"] for r in tail.read()] == [1, 2]
    assert read_jsonl(str(path)) == [{"step": 1}, {"step": 2}], "a writer that died mid-line leaves a tail the reader skips"
    with open(path, "a") as f:
        f.write(json.dumps({"step": 3})[5:] + "\n" + "not json\n" + json.dumps({"step": 4}) + "\n")
    assert [r["step"] for r in tail.read()] == [3, 4], "the rest of the line completes it; a garbled line is skipped"
    assert tail.read() == []


def test_reporter_lines_are_whole_under_concurrent_threads(tmp_path):
    path = tmp_path / "r.jsonl"
    reporter = RankReporter(str(path), 1, 0, 2)

    def burst(i):
        for n in range(200):
            reporter.event(EventKind.CHECKPOINT_SENT, thread=i, n=n, pad="x" * 500)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reporter.close()
    reporter.event(EventKind.RANK_FINISHED)  # a late report from a transport thread: dropped, no error
    records = read_jsonl(str(path))
    assert len(records) == 800 and all(r["group"] == 1 and r["attempt"] == 2 for r in records)


class FakeAllreduce:
    """The collective torchft's Manager.allreduce performs across groups: the sum of the
    participating groups' tensors (SUM), or that divided by their number (AVG, its default); a
    group that is not participating (healing) contributes zeros. A fake for GradSync's packing,
    with one thread per group."""

    def __init__(self, groups: int, participating: set[int]) -> None:
        self.participating = participating
        self.barrier = threading.Barrier(groups)
        self.buffers: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def for_group(self, group: int):
        fake = self

        class Manager:
            def allreduce(self, tensor, reduce_op=ReduceOp.AVG):
                if group not in fake.participating:
                    tensor.zero_()
                with fake.lock:
                    fake.buffers[group] = tensor.clone()
                fake.barrier.wait()
                total = sum(fake.buffers.values())
                fake.barrier.wait()
                tensor.copy_(total if reduce_op == ReduceOp.SUM else total / len(fake.participating))

                class Done:
                    def wait(self):
                        return True

                return Done()

        return Manager()


def _params(seed):
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(2))]
    for p in params[:2]:
        p.grad = torch.randn_like(p)
    return params  # the last one has no gradient (unused this step)


@pytest.mark.parametrize("participating", [{0, 1, 2}, {0, 2}])
def test_grad_sync_averages_every_shard_in_one_collective_and_names_the_groups_counted(participating):
    groups = [_params(seed) for seed in range(3)]
    grads_before = [[p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in ps] for ps in groups]
    objects = [[p.grad for p in ps] for ps in groups]
    fake = FakeAllreduce(3, participating)
    members: dict[int, list[int]] = {}
    vetoes: dict[int, list[int]] = {}

    def run(g):
        synced = GradSync(groups[g], num_groups=3, group=g).sync(fake.for_group(g))
        members[g], vetoes[g] = synced.members, synced.vetoes
        assert synced.micro_batches == len(participating) and synced.finish is None

    threads = [threading.Thread(target=run, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert members == dict.fromkeys(range(3), sorted(participating)) and vetoes == dict.fromkeys(range(3), [])
    for i in range(3):
        expected = sum(grads_before[g][i] for g in participating) / len(participating)
        for g in range(3):
            assert torch.allclose(groups[g][i].grad, expected)
    # Gradients averaged in place: the optimizer keeps the very tensors it holds (a missing one is made).
    for g in range(3):
        assert groups[g][0].grad is objects[g][0] and groups[g][2].grad is not None


def test_grad_sync_averages_per_micro_batch_when_groups_summed_unequal_numbers():
    """ft.global_batch=constant, 3 slots over 2 groups: group 0 sums two micro-batches' gradients
    (its slot and the absent group's), group 2 one. The average is over the 3 micro-batches, as a
    fault-free step averages its 3 groups' (equal-token) micro-batches, not over the 2 groups."""
    torch.manual_seed(0)
    micro = [torch.randn(7) for _ in range(3)]  # each slot's gradient
    params = {0: [torch.nn.Parameter(torch.zeros(7))], 2: [torch.nn.Parameter(torch.zeros(7))]}
    params[0][0].grad = micro[0] + micro[1]
    params[2][0].grad = micro[2].clone()
    fake, out = FakeAllreduce(2, {0, 2}), {}

    def run(g, k):
        out[g] = GradSync(params[g], num_groups=3, group=g).sync(fake.for_group(g), micro_batches=k)

    threads = [threading.Thread(target=run, args=(g, k)) for g, k in ((0, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {0: Synced([0, 2], [], 3), 2: Synced([0, 2], [], 3)}
    for g in (0, 2):
        assert torch.allclose(params[g][0].grad, (micro[0] + micro[1] + micro[2]) / 3)


def test_grad_sync_agrees_on_the_lowest_finish_the_counted_groups_read():
    """Each group offers the finish it read; every group of the step, a healing one too, learns
    the lowest offer of the groups counted (a healing group's zeros offer nothing), exactly,
    however large the step."""
    params = {g: [torch.nn.Parameter(torch.zeros(4))] for g in range(3)}
    for ps in params.values():
        ps[0].grad = torch.ones(4)
    offers = {0: 2**40 + 3, 1: 5, 2: 10**9 + 7}  # group 1 heals in this step
    fake, out = FakeAllreduce(3, {0, 2}), {}

    def run(g):
        out[g] = GradSync(params[g], num_groups=3, group=g).sync(fake.for_group(g), finish=offers[g])

    threads = [threading.Thread(target=run, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == dict.fromkeys(range(3), Synced([0, 2], [], 2, 10**9 + 7))


@pytest.mark.parametrize("holding", [{1, 2}, set()])
def test_a_straggler_learns_in_the_quorums_first_collective_that_its_peers_hold(holding):
    """The order of CI at abeb6af, replayed on the exchange: groups 1 and 2 agreed a finish of 30
    at a sync group 0 missed and hold there; group 0, which agreed no finish, heals in their
    quorum (its slots are zeros). Every group learns who holds and the finish from the one
    exchange, so group 0 runs none of the sync's averages (Membership.peers_hold) and stops at
    30. In a quorum where nobody holds, nobody skips its averages."""
    offers = {0: None, 1: 30, 2: 35}
    fake, out = FakeAllreduce(3, {1, 2}), {}

    def run(g):
        summed = Membership.slots(3, g, offers[g], g in holding)
        fake.for_group(g).allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        out[g] = Membership.read(summed.tolist(), 3)

    threads = [threading.Thread(target=run, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == dict.fromkeys(range(3), Membership([1, 2], sorted(holding), 30))
    assert out[0].peers_hold(0) is bool(holding)


def test_the_exchange_carries_a_large_finish_exactly():
    summed = Membership.slots(2, 1, 2**40 + 3, False) + Membership.slots(2, 0, None, True)
    assert Membership.read(summed.tolist(), 2) == Membership([0, 1], [0], 2**40 + 3)


@pytest.mark.parametrize("finish", [5, 3, 6])
def test_a_finish_written_between_two_groups_reads_ends_both_on_one_step(tmp_path, finish):
    """The race of CI at a1c0f44, replayed: a finish lands at the top of step 5 after group 0
    read the file and before group 1 did (at the step, below it, or just after it). Each group
    decides on what its last quorum agreed (StopAt.in_force), offers its read in the step's
    collective and takes the lowest offer (GradSync, StopAt.agree), as rank.trainer does: both
    train the same steps and end on the same one. Had each decided on its own read, group 1
    would have stopped at 5 while group 0 waited in step 5's collective for it (a barrier
    timeout here; in a job, a step trained alone and two final weights)."""
    path = str(tmp_path / "stop_at_step")
    fake = FakeAllreduce(2, {0, 1})
    fake.barrier = threading.Barrier(2, timeout=10)
    group0_read, written = threading.Event(), threading.Event()
    trained: dict[int, list[int]] = {0: [], 1: []}
    ended: dict[int, int] = {}

    def run(g):
        stop, step = StopAt(path, 100), 0
        params = [torch.nn.Parameter(torch.zeros(2))]
        while True:
            if g == 1 and step == 5:
                assert written.wait(10)
            read = stop.steps()
            if g == 0 and step == 5:
                group0_read.set()
            if step >= stop.in_force(read):
                ended[g] = step
                return
            params[0].grad = torch.ones(2)
            synced = GradSync(params, num_groups=2, group=g).sync(fake.for_group(g), finish=read)
            stop.agree(synced.finish)
            trained[g].append(step)
            step += 1

    threads = [threading.Thread(target=run, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    assert group0_read.wait(10)
    atomic_write(path, str(finish))
    written.set()
    for t in threads:
        t.join(20)
    assert ended == {0: max(finish, 6), 1: max(finish, 6)} and trained[0] == trained[1] == list(range(max(finish, 6)))


def test_load_in_place_copies_into_the_live_tensors_and_names_what_differs():
    live = {"model": {"w": torch.zeros(2, 3), "b": torch.zeros(3)}, "optim": {"w": [torch.zeros(2, 3), torch.zeros(1)]}}
    held = live["model"]["w"]
    incoming = {"model": {"w": torch.ones(2, 3), "b": torch.full((3,), 2.0)}, "optim": {"w": [torch.ones(2, 3), torch.tensor([7.0])]}}
    load_in_place(live, incoming)
    assert live["model"]["w"] is held and bool((held == 1).all()) and bool((live["model"]["b"] == 2).all())
    assert live["optim"]["w"][1].item() == 7.0

    def refused(incoming_tree):
        with pytest.raises(ValueError) as e:
            load_in_place({"model": {"w": torch.zeros(2, 3)}, "optim": [torch.zeros(1)]}, incoming_tree)
        return str(e.value)

    assert "model.w: expected (2, 3) torch.float32, got ((3, 2), torch.float32)" in refused({"model": {"w": torch.zeros(3, 2)}, "optim": [torch.zeros(1)]})
    assert "model.w: expected (2, 3) torch.float32, got ((2, 3), torch.float64)" in refused(
        {"model": {"w": torch.zeros(2, 3, dtype=torch.float64)}, "optim": [torch.zeros(1)]}
    )
    assert "model: keys differ (['v', 'w'])" in refused({"model": {"v": torch.zeros(2, 3)}, "optim": [torch.zeros(1)]})
    assert "optim: length 2 != 1" in refused({"model": {"w": torch.zeros(2, 3)}, "optim": [torch.zeros(1), torch.zeros(1)]})
    assert "got <class 'NoneType'>" in refused({"model": {"w": None}, "optim": [torch.zeros(1)]})
