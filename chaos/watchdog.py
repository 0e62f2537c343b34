"""The drill's watchdog: the process that SIGKILLs the controller and attaches a new one.

A ``controller`` fault cannot be injected from inside the controller it kills (the chaos
injector is a supervisor hook), so a drill (``monarch-ft drill``) with such a fault runs the drill
in a child process and becomes this small watchdog. When the injector asks
(:func:`request_controller_kill`, a file in ``control/``), the watchdog SIGKILLs the child
at once, lets the job train unsupervised for the fault's ``delay_s``, then starts the
same drill again with ``controller.attach=true`` in the same run directory: the new
controller takes the job over, and the injector picks up where the killed one stopped
(``chaos_injector.json``). The drill's exit status is the last controller's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Optional

from monarch_ft.records.layout import RunLayout, atomic_write_json, read_json

# Set in the drill's own (child) process: it must not become a watchdog itself.
CHILD_ENV = "MONARCH_FT_DRILL_CONTROLLER"


def is_watched() -> bool:
    return bool(os.environ.get(CHILD_ENV))


def request_controller_kill(layout: RunLayout, delay_s: float, rank: Optional[tuple[int, int]] = None) -> dict:
    """What the injector does for a ``controller`` fault: ask the watchdog (fails loudly without
    one); ``rank``: (group, rank) to SIGKILL too while no controller is attached."""
    if not is_watched():
        raise RuntimeError("a controller fault needs the drill's watchdog: run it through monarch-ft drill")
    atomic_write_json(layout.kill_controller, {"delay_s": delay_s, "requested_at": time.time(), "pid": os.getpid(), "rank": rank})
    return {"pid": os.getpid(), "signal": "SIGKILL", "delay_s": delay_s, "by": "watchdog", "watchdog_pid": os.getppid()}


def _kill_rank(layout: RunLayout, group: int, rank: int) -> str:
    """SIGKILL one recorded rank (checked by pid and start time) while nobody supervises."""
    from monarch_ft.common.process import ProcessIdentity

    state = layout.read_controller_state() or {}
    for r in state["groups"][group]["ranks"]:
        if r["launch"]["rank"] == rank and r.get("pid"):
            ident = ProcessIdentity(r["pid"], r["start"])
            if ident.alive():
                os.kill(ident.pid, signal.SIGKILL)
                return f"SIGKILLed rank {rank} of group {group} (pid {ident.pid}) while no controller is attached"
    return f"rank {rank} of group {group} was not running: nothing killed"


def run_watched(argv: list[str], run_dir: str, echo=print) -> int:
    """Run ``argv`` (``-m`` and the drill recipe's module, its overrides, without hydra.run.dir) as
    the controller; kill and reattach it on request. Returns the last controller's exit code."""
    from monarch_ft.common.process import on_python_path

    layout = RunLayout(run_dir)
    env = on_python_path({**os.environ, CHILD_ENV: "1"})
    base = [sys.executable, *argv, f"hydra.run.dir={layout.run_dir}"]
    child = subprocess.Popen(base, env=env)
    current: dict[str, Optional[subprocess.Popen]] = {"child": child}

    def forward(sig, _frame) -> None:
        proc = current["child"]
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    while True:
        proc = current["child"]
        code = proc.poll()
        if code is not None:
            return code
        request = read_json(layout.kill_controller)
        if request:
            os.remove(layout.kill_controller)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            echo(f"[chaos watchdog] SIGKILLed the controller (pid {proc.pid}); the job trains unsupervised for {request['delay_s']:g}s")
            current["child"] = None
            if request.get("rank"):
                time.sleep(float(request["delay_s"]) / 2)
                echo(f"[chaos watchdog] {_kill_rank(layout, *request['rank'])}")
                time.sleep(float(request["delay_s"]) / 2)
            else:
                time.sleep(float(request["delay_s"]))
            current["child"] = subprocess.Popen([*base, "controller.attach=true"], env=env)
            echo(f"[chaos watchdog] attached a new controller (pid {current['child'].pid})")
        time.sleep(0.05)
