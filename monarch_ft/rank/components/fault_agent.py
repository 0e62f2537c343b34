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
        self._report = report
        if gil_signal and threading.current_thread() is threading.main_thread():
            signal.signal(GIL_HANG_SIGNAL, self._gil_hang)

    def _gil_hang(self, signum, frame) -> None:
        # Nothing reported first: the handler may interrupt the main thread inside the
        # reporter's lock, and the fault's time is the injector's anyway.
        sleep_holding_the_gil(3600)

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
