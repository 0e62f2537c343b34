"""Python stacks of live ranks, for hangs and stalls: what was each thread doing?

py-spy reads a process's stacks from outside, also when it is SIGSTOPped or stuck
holding the GIL, so it is the first choice. Where it is missing or not allowed
(ptrace), the rank's own faulthandler answers SIGUSR1 by writing every thread's
stack to its log (see rank.trainer.train); faulthandler's handler runs in C without the
GIL, so it also answers a rank that sleeps holding it, but not a stopped one. The
fallback copies what the rank wrote into the stacks file when the rank's log is known.

:func:`capture_stacks` is the one entry point (the supervisor's hang and stall
verdicts, :meth:`Supervisor.capture_stacks` on demand, and ``python -m monarch_ft stacks``
from outside the job: :func:`monarch_ft.cli.jobctl.job_stacks`, which finds the live ranks by
the pid and start time the controller recorded).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Optional


def py_spy() -> Optional[str]:
    """The py-spy binary beside this interpreter (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def _log_size(path: Optional[str]) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _faulthandler_dump(pid: int, log: Optional[str], wait_s: float = 1.0) -> str:
    """SIGUSR1 to the rank (its faulthandler writes every thread's stack to its log), then
    what it appended to the log, if the log is known."""
    before = _log_size(log)
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as e:
        return f"SIGUSR1 failed: {e}\n"
    text = "sent SIGUSR1: the rank's faulthandler writes its stacks to the rank's log (not if it is stopped)\n"
    if not log:
        return text
    deadline = time.time() + wait_s
    while time.time() < deadline and _log_size(log) == before:
        time.sleep(0.05)
    time.sleep(0.1)  # the rest of the dump
    try:
        with open(log, "rb") as f:
            f.seek(before)
            dumped = f.read(256 * 1024).decode(errors="replace")
    except OSError:
        dumped = ""
    return text + (f"from {log}:\n{dumped}" if dumped else f"nothing appeared in {log} within {wait_s}s\n")


def _stopped(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except Exception:
        return False


def _write(path: str, text: str) -> bool:
    """Write a stacks file; False when it cannot be (the run directory's disk full, read-only):
    the dump is evidence, never a reason for a traceback in a thread of the controller."""
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def _dump_one(pid: int, path: str, tool: Optional[str], timeout_s: float, log: Optional[str] = None, written: Optional[set] = None) -> None:
    text = ""
    stopped = _stopped(pid)
    if tool:
        # py-spy suspends the process (ptrace) to read a consistent stack; a SIGSTOPped one
        # cannot be suspended again ("Failed to suspend process"), but it holds still already.
        argv = [tool, "dump", "--pid", str(pid)] + (["--nonblocking"] if stopped else [])
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            text = res.stdout + (res.stderr if res.returncode else "")
            if res.returncode == 0:
                if _write(path, text) and written is not None:
                    written.add(path)
                return
        except subprocess.TimeoutExpired:
            text = f"py-spy dump timed out after {timeout_s}s\n"
    else:
        text = "py-spy not found\n"
    text += "the process is stopped: its faulthandler cannot answer\n" if stopped else _faulthandler_dump(pid, log)
    if _write(path, text) and written is not None:
        written.add(path)


def capture_stacks(pids: dict[str, int], folder: str, timeout_s: float = 10.0, logs: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Dump every process of ``pids`` (label -> pid) into ``folder/<label>.txt``, in parallel.

    Args:
        pids: processes to dump, by a label naming the rank (``g0r1``).
        folder: created if missing; one file per process.
        timeout_s: bound on each dump; the whole capture takes about the slowest one.
        logs: label -> the rank's log file, where its faulthandler writes when py-spy
            cannot read it (the fallback copies that part into the stacks file).

    Returns:
        label -> the file written (none that could not be: a full or read-only disk).
    """
    if not pids:
        return {}
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return {}
    tool = py_spy()
    logs = logs or {}
    paths = {label: os.path.join(folder, f"{label}.txt") for label in pids}
    written: set[str] = set()
    threads = [
        threading.Thread(target=_dump_one, args=(pid, paths[label], tool, timeout_s, logs.get(label), written), daemon=True) for label, pid in pids.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 2)
    return {label: path for label, path in paths.items() if path in written}
