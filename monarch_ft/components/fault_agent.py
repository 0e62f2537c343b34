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

import json
import os
import time
from typing import Callable


def request_path(control_dir: str, group: int, rank: int) -> str:
    return os.path.join(control_dir, f"collective_fault_g{group}r{rank}.json")


def request_collective_fault(control_dir: str, group: int, rank: int, mode: str, duration_s: float) -> str:
    path = request_path(control_dir, group, rank)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"mode": mode, "duration_s": duration_s, "requested_at": time.time()}, f)
    os.replace(tmp, path)
    return path


class FaultAgent:
    def __init__(self, control_dir: str, group: int, rank: int, report: Callable[..., None]) -> None:
        self.path = request_path(control_dir, group, rank)
        self._report = report

    def before_allreduce(self, manager) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            request = json.load(f)
        os.remove(self.path)
        mode = request["mode"]
        self._report("collective_fault_injected", mode=mode, step=manager.current_step(), requested_at=request["requested_at"])
        if mode == "abort":
            manager._pg.abort()
        elif mode == "hang":
            time.sleep(float(request["duration_s"]))
        else:
            raise ValueError(f"unknown collective fault mode {mode!r}")
