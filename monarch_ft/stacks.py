"""Python stacks of live ranks, for hangs and stalls: what was each thread doing?

py-spy reads a process's stacks from outside, also when it is SIGSTOPped or stuck
holding the GIL, so it is the first choice. Where it is missing or not allowed
(ptrace), the rank's own faulthandler answers SIGUSR1 by writing every thread's
stack to its log (see trainer.train); that works for a rank that still runs signal
handlers, not for a stopped one, and the file then says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Optional


def py_spy() -> Optional[str]:
    """The py-spy binary beside this interpreter (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def _dump_one(pid: int, path: str, tool: Optional[str], timeout_s: float) -> None:
    if tool:
        try:
            res = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s)
            text = res.stdout + (res.stderr if res.returncode else "")
            if res.returncode == 0:
                with open(path, "w") as f:
                    f.write(text)
                return
        except subprocess.TimeoutExpired:
            text = f"py-spy dump timed out after {timeout_s}s\n"
    else:
        text = "py-spy not found\n"
    try:
        os.kill(pid, signal.SIGUSR1)
        text += "sent SIGUSR1: the rank's faulthandler writes its stacks to the rank's log (not if it is stopped)\n"
    except OSError as e:
        text += f"SIGUSR1 failed: {e}\n"
    with open(path, "w") as f:
        f.write(text)


def capture_stacks(pids: dict[str, int], folder: str, timeout_s: float = 10.0) -> dict[str, str]:
    """Dump every process of ``pids`` (label -> pid) into ``folder/<label>.txt``, in parallel.

    Args:
        pids: processes to dump, by a label naming the rank (``g0r1``).
        folder: created if missing; one file per process.
        timeout_s: bound on each dump; the whole capture takes about the slowest one.

    Returns:
        label -> the file written.
    """
    if not pids:
        return {}
    os.makedirs(folder, exist_ok=True)
    tool = py_spy()
    paths = {label: os.path.join(folder, f"{label}.txt") for label in pids}
    threads = [threading.Thread(target=_dump_one, args=(pid, paths[label], tool, timeout_s), daemon=True) for label, pid in pids.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 2)
    return paths
