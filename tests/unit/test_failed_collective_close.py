"""A failed cross-group collective reaches every survivor of a gloo ring at once.

Real gloo process groups (torchft's reconfigurable ProcessGroupGloo over a TCPStore), one per
thread, six ranks in a ring. Rank 3 dies as a process would mid-step: it never joins the
allreduce and its sockets close. Only its two neighbours see that; the others wait on them.
Each survivor does what MonarchManager.should_commit does after a failed step
(ft.close_failed_process_group), and every one fails well inside the collective's timeout.
Without the close each survivor keeps its process group open until its next quorum, as the
Manager does, and the far side of the ring waits the timeout out (3 s a fault at 8 and 16
groups in benchmarks/scale_bench.py before this).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch

from monarch_ft.rank.components.ft import close_failed_process_group
from monarch_ft.rank.components.torchft_compat import process_group_open

RANKS, VICTIM = 6, 3
TIMEOUT_S = 8.0  # what a survivor that is never told would wait
BOUND_S = 4.0  # half of it: the far side of the ring must learn of the death long before


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_closing_a_failed_group_fails_the_whole_ring_within_the_timeout():
    from torch.distributed import TCPStore
    from torch.distributed.distributed_c10d import AllreduceOptions, ReduceOp
    from torchft.process_group import ProcessGroupGloo

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pgs = [ProcessGroupGloo(timeout=timedelta(seconds=TIMEOUT_S)) for _ in range(RANKS)]
    configured = [threading.Thread(target=pg.configure, args=(f"localhost:{store.port}/ring", "ring", r, RANKS)) for r, pg in enumerate(pgs)]
    for t in configured:
        t.start()
    for t in configured:
        t.join(30)
    assert all(process_group_open(pg) for pg in pgs)

    started = threading.Barrier(RANKS)
    failed_after: dict[int, float] = {}

    def survivor(rank: int) -> None:
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM
        started.wait()
        t0 = time.monotonic()
        try:
            pgs[rank].allreduce([torch.ones(1 << 20)], opts).wait()
        except Exception:
            failed_after[rank] = time.monotonic() - t0
            assert close_failed_process_group(pgs[rank])

    def victim() -> None:
        started.wait()
        time.sleep(0.3)  # the others are inside the allreduce, waiting on it
        pgs[VICTIM].abort(errored=False)  # its backend dropped: its sockets close, as in a kill

    threads = [threading.Thread(target=victim if r == VICTIM else survivor, args=() if r == VICTIM else (r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S + 10)
    survivors = sorted(set(range(RANKS)) - {VICTIM})
    assert sorted(failed_after) == survivors, failed_after
    slowest = max(failed_after.values())
    assert slowest < BOUND_S, f"a survivor waited {slowest:.2f} s for the death to reach it ({failed_after})"
    assert not any(process_group_open(pg) for pg in pgs)
    assert close_failed_process_group(pgs[0]) is False  # closing twice is a no-op
