"""The rank-side half of collective-fault injection.

A process fault can be done from outside (a signal); a fault *inside a collective*
cannot, so the chaos injector drops a request file for one rank and the rank acts on
it at its next cross-group allreduce:

- ``abort``: abort the rank's TorchFT process group (gloo on CPU; on CUDA the same call
  is NCCL's communicator abort), so this step's allreduce fails on every participant;
- ``hang``: stall before joining the allreduce for ``duration_s``, so the peers'
  collective hits its timeout.

Either way TorchFT must discard the step (should_commit is False) and reconfigure
the process group on the next quorum, with no process restarted.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from monarch_ft.run_layout import RunLayout, atomic_write_json, read_json


def request_collective_fault(layout: RunLayout, group: int, rank: int, mode: str, duration_s: float) -> str:
    path = layout.collective_fault(group, rank)
    atomic_write_json(path, {"mode": mode, "duration_s": duration_s, "requested_at": time.time()})
    return path


def request_slow_save(layout: RunLayout, group: int, rank: int, delay_s: float) -> str:
    """Make the rank's next checkpoint save take ``delay_s`` longer (slow storage)."""
    path = layout.slow_save(group, rank)
    atomic_write_json(path, {"delay_s": delay_s, "requested_at": time.time()})
    return path


def _take(path: str):
    """The request in ``path``, removed so it acts once; None when there is none."""
    if not os.path.exists(path):
        return None
    request = read_json(path)
    os.remove(path)
    return request


class FaultAgent:
    def __init__(self, layout: RunLayout, group: int, rank: int, report: Callable[..., None]) -> None:
        self.path = layout.collective_fault(group, rank)
        self.save_path = layout.slow_save(group, rank)
        self._report = report

    def before_allreduce(self, ft) -> None:
        """``ft``: the rank's FTParts (its step, and the cross-group process group to abort)."""
        request = _take(self.path)
        if request is None:
            return
        mode = request["mode"]
        self._report("collective_fault_injected", mode=mode, step=ft.current_step(), requested_at=request["requested_at"])
        if mode == "abort":
            ft.abort_process_group()
        elif mode == "hang":
            time.sleep(float(request["duration_s"]))
        else:
            raise ValueError(f"unknown collective fault mode {mode!r}")

    def during_save(self) -> None:
        """Inside a checkpoint save: storage that answers slowly, for as long as asked."""
        request = _take(self.save_path)
        if request is None:
            return
        self._report("slow_save_injected", delay_s=request["delay_s"], requested_at=request["requested_at"])
        time.sleep(float(request["delay_s"]))
