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

A bit flip (chaos ``bitflip``) is a request file too, taken at the top of the rank's next
step: one bit of one element of its live model or optimizer state, flipped in place, and
nothing else (no crash, no signal): finding it is the integrity checks' job.

One process fault also needs the rank's help: a ``hang`` with ``mode: gil``. On
:data:`GIL_HANG_SIGNAL` the rank sleeps in a C call that keeps the GIL (``ctypes.PyDLL``
does not release it), so no Python thread of it runs again: not its liveness thread,
not TorchFT's Python threads. Its OS state stays "sleeping", like its peers' blocked in a
collective with it; only its silence tells the hang detector which rank is stuck.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Callable

from monarch_ft.rank.components.integrity import flip_bit, named_tensors
from monarch_ft.records.events import EventKind
from monarch_ft.records.faults import GIL_HANG_SIGNAL
from monarch_ft.records.layout import RunLayout, read_json


def _take(path: str):
    """The request in ``path``, removed so it acts once; None when there is none."""
    if not os.path.exists(path):
        return None
    request = read_json(path)
    os.remove(path)
    return request


def sleep_holding_the_gil(seconds: float) -> None:
    """libc's sleep through ctypes.PyDLL, which keeps the GIL for the call: the whole
    interpreter stops (py-spy and faulthandler still show this frame)."""
    ctypes.PyDLL(None).sleep(int(seconds))


class FaultAgent:
    """The rank's side of the faults that need it (a collective fault, a slow save, a GIL hang).

    Args:
        layout: the run's paths (request files).
        group, rank: whose requests to act on.
        report: the rank reporter's ``event``.
        gil_signal: answer :data:`GIL_HANG_SIGNAL`. Python installs signal handlers from the
            main thread only: a rank trained in another thread (a Monarch actor's worker
            thread) does not answer it, and drills refuse ``mode: gil`` there.
    """

    def __init__(self, layout: RunLayout, group: int, rank: int, report: Callable[..., None], gil_signal: bool = True) -> None:
        self.path = layout.collective_fault(group, rank)
        self.save_path = layout.slow_save(group, rank)
        self.bitflip_path = layout.bitflip(group, rank)
        self.transfer_path = layout.transfer_fault(group, rank)
        self._report = report
        if gil_signal and threading.current_thread() is threading.main_thread():
            signal.signal(GIL_HANG_SIGNAL, self._gil_hang)

    def _gil_hang(self, signum, frame) -> None:
        # Nothing reported first: the handler may interrupt the main thread inside the
        # reporter's lock, and the fault's time is the injector's anyway.
        sleep_holding_the_gil(3600)

    def before_step(self, step: int, state: Callable[[], dict], ft) -> None:
        """At the top of a step: a drill's bit flip into this rank's live state (chaos
        ``bitflip``; ``state`` returns the live model and optimizer tensors, flipped in place),
        and a test's request to damage what this rank's transport sends (``ft``: its FTParts)."""
        request = _take(self.bitflip_path)
        if request is not None:
            try:
                done = flip_bit(named_tensors(state()), request["tensor"], str(request["bit"]), int(request["seed"]))
            except ValueError as e:
                done = {"error": str(e)}  # reported, not raised: a drill's typo must not kill a replica
            self._report(EventKind.BITFLIP_INJECTED, step=step, requested_at=request["requested_at"], **done)
        request = _take(self.transfer_path)
        if request is not None:
            armed = ft.arm_transfer_fault({k: v for k, v in request.items() if k != "requested_at"})
            self._report(EventKind.TRANSFER_FAULT_ARMED, step=step, armed=armed, chunk=request.get("corrupt_chunk"), requested_at=request["requested_at"])

    def before_allreduce(self, ft) -> None:
        """``ft``: the rank's FTParts (its step, and the cross-group process group to abort)."""
        request = _take(self.path)
        if request is None:
            return
        mode = request["mode"]
        self._report(EventKind.COLLECTIVE_FAULT_INJECTED, mode=mode, step=ft.current_step(), requested_at=request["requested_at"])
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
        self._report(EventKind.SLOW_SAVE_INJECTED, delay_s=request["delay_s"], requested_at=request["requested_at"])
        time.sleep(float(request["delay_s"]))
