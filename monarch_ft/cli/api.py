"""The Python API: drive a job from a script or a notebook (``monarch_ft.launch``, ``monarch_ft.attach``).

The Monarch way of working: one program drives the cluster and reconnects after a disconnect.
:func:`launch` starts the job's controller as a process of its own (a new session: a notebook
kernel that restarts or dies does not take the job with it) and returns a :class:`JobHandle`;
:func:`attach` returns a handle on a job already running (or finished) from its run directory.
A handle reads and writes the run directory only, as the command line does (monarch_ft.cli.jobctl):
``monarch-ft status/stop`` are thin entries over the same handle.

A launched job runs as a drill with ``chaos.on_demand=true``: no fault unless asked for, and
:meth:`JobHandle.inject` asks for one while it trains; it is injected, timed and reported as a
drill's faults are (``drill.json``, :meth:`JobHandle.report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

from monarch_ft.cli.jobctl import job_status, job_stop, open_run
from monarch_ft.common.process import ProcessIdentity, on_python_path
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.fault_requests import request_fault
from monarch_ft.records.layout import RunLayout, atomic_write_json, read_json, read_jsonl

# What launch() starts: the drill recipe, faults on demand only.
DRILL_MODULE = "monarch_ft.recipes.drill"
# The launched process's identity (pid and start time) and its command line, in the run directory.
API_FILE = "api.json"
# How often the waits look again.
POLL_S = 0.2


class JobHandle:
    """A job, by its run directory: what it is doing, its events, faults on demand, stop, wait, report.

    Args:
        run_dir: the job's run directory.
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = os.path.abspath(run_dir)

    def __repr__(self) -> str:
        return f"JobHandle({self.run_dir!r})"

    # ------------------------------------------------------------ reading
    def status(self) -> dict[str, Any]:
        """The job at a glance, as ``monarch-ft status --json`` prints it (each group's state, step,
        loss, restarts; the last faults and their MTTR; the controller; how it ended)."""
        return dataclasses.asdict(job_status(self.run_dir))

    def events(self, since: float = 0.0, kind: Optional[str] = None) -> list[dict[str, Any]]:
        """The job's events after time ``since`` (seconds since the epoch), oldest first: a list of flat
        dicts (``pandas.DataFrame(handle.events())`` makes a table of it).

        Args:
            since: only events strictly after this time.
            kind: only events of this kind (an EventKind value, e.g. ``fault_recovered``).
        """
        events = read_jsonl(RunLayout(self.run_dir).events)
        return [e for e in events if e["time"] > since and (kind is None or e["event"] == kind)]

    def running(self) -> bool:
        """Whether the process :func:`launch` started (the drill and its controller) still runs;
        for a job not launched through the API, whether its controller is attached."""
        launched = read_json(os.path.join(self.run_dir, API_FILE))
        if launched:
            return ProcessIdentity(launched["pid"], launched["start"]).alive()
        from monarch_ft.controller.takeover import controller_attached

        return controller_attached(RunLayout(self.run_dir)) is not None

    # ------------------------------------------------------------ acting
    def inject(self, kind: str, target: Optional[int] = None, timeout: float = 60.0, **options: Any) -> int:
        """Ask for a fault now (a drill's fault kind: ``process_kill``, ``hang``, ``node``...; its options
        as keywords, e.g. ``mode="gil"``, ``rank=1``, ``at_step=40``). It fires once the previous one has
        recovered, and is timed as a drill's faults are. Returns its fault id (``fault_id`` in its
        events, its index in :meth:`report`'s faults).

        Args:
            kind: the fault kind.
            target: the group it hits (default: a healthy one, drawn).
            timeout: seconds to wait for the controller to accept the request.
            options: the kind's own options.

        Raises:
            ConfigError: the controller refused it (the one-line reason), or did not answer in time.
        """
        open_run(self.run_dir)
        fault = {"kind": kind, "target": target, **options}
        name = request_fault(self.run_dir, fault)
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.events():
                if e.get("request") == name and e["event"] == EventKind.FAULT_REQUESTED:
                    return int(e["fault_id"])
                if e.get("request") == name and e["event"] == EventKind.FAULT_REQUEST_REFUSED:
                    raise ConfigError(e["error"])
            if not self.running():
                raise ConfigError(f"{self.run_dir}: the job is not running (or was not launched with chaos.on_demand=true): no fault can be injected")
            time.sleep(POLL_S)
        raise ConfigError(f"the controller did not take the fault request {name} within {timeout:g}s: is the job a drill with chaos.on_demand=true?")

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the job cleanly (every group finishes at one common step, with a checkpoint), as
        ``monarch-ft stop`` does; returns once its ranks are gone.

        Args:
            timeout: seconds to wait for the ranks to stop.
        """
        left = job_stop(self.run_dir, timeout, echo=lambda _line: None)
        if left:
            raise ConfigError(f"{self.run_dir}: still running after {timeout:g}s: see monarch-ft status {self.run_dir}")

    def wait(self, step: Optional[int] = None, fault: Optional[int] = None, timeout: Optional[float] = None) -> dict[str, Any]:
        """Wait until the job has committed ``step`` steps, or fault ``fault`` has recovered (or timed
        out), or with neither, until the job and what launched it have ended; returns :meth:`status`.

        Args:
            step: a committed step to wait for.
            fault: a fault id (from :meth:`inject`) to wait for.
            timeout: seconds (default: no bound).

        Raises:
            TimeoutError: not reached within ``timeout``.
            ConfigError: the job ended before ``step`` or ``fault`` was reached.
        """
        deadline = None if timeout is None else time.time() + timeout
        while deadline is None or time.time() < deadline:
            if fault is not None:
                done = [e for e in self.events() if e.get("fault_id") == fault and e["event"] in (EventKind.FAULT_RECOVERED, EventKind.FAULT_RECOVERY_TIMEOUT)]
                if done:
                    return self.status()
            elif step is not None:
                view = self.status()
                if view["job_step"] >= step:
                    return view
            elif not self.running() and read_json(RunLayout(self.run_dir).summary):
                return self.status()
            if (step is not None or fault is not None) and not self.running():
                raise ConfigError(f"{self.run_dir}: the job ended before {'step ' + str(step) if fault is None else 'fault ' + str(fault) + ' recovered'}")
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.run_dir}: not reached within {timeout:g}s")

    def report(self) -> dict[str, Any]:
        """The drill report's figures (``drill.json``: per fault its MTTR and phases, recovery path,
        survivors' stall, weights; goodput), written when the job ends.

        Raises:
            ConfigError: the job has not ended yet (stop or wait for it first).
        """
        drill = read_json(os.path.join(self.run_dir, "drill.json"))
        if drill is None:
            raise ConfigError(f"{self.run_dir}: no drill.json yet: the report is written when the job ends (call .stop(), then .wait())")
        return drill


def launch(overrides: Optional[list[str]] = None, run_dir: Optional[str] = None) -> JobHandle:
    """Start a job (the drill recipe with ``chaos.on_demand=true``: faults only when asked for) in a
    process of its own, and return its handle once the job has started.

    Args:
        overrides: Hydra overrides, as on the command line (``["ft.replica_groups=2", "training.steps=200"]``).
        run_dir: the run directory (default: ``outputs/api/<time>`` under the working directory).

    Raises:
        ConfigError: the overrides are refused (the one-line reason), or the job did not start.
    """
    run_dir = os.path.abspath(run_dir or os.path.join("outputs", "api", time.strftime("%Y-%m-%d_%H-%M-%S")))
    layout = RunLayout(run_dir)
    if read_json(layout.controller_state) and not (read_json(layout.controller_state) or {}).get("finished"):
        raise ConfigError(f"{run_dir}: a job is running there: monarch_ft.attach({run_dir!r}), or give another run_dir")
    os.makedirs(run_dir, exist_ok=True)
    argv = [sys.executable, "-m", DRILL_MODULE, "chaos.on_demand=true", *(overrides or []), f"hydra.run.dir={run_dir}"]
    log = open(run_dir + ".console.log", "ab")
    # A session of its own: a kernel's restart or death (a signal to its process group) leaves the job running.
    proc = subprocess.Popen(argv, env=on_python_path(os.environ), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    atomic_write_json(os.path.join(run_dir, API_FILE), {"pid": proc.pid, "start": ProcessIdentity.of(proc.pid).start, "argv": argv})
    while not os.path.exists(layout.events):
        code = proc.poll()
        if code is not None:
            with open(run_dir + ".console.log", errors="replace") as f:
                last = [line for line in f.read().splitlines() if line.strip()][-1:] or [f"exit {code}"]
            raise ConfigError(f"the job did not start (exit {code}): {last[0].removeprefix('monarch_ft: error: ')}")
        time.sleep(POLL_S)
    return JobHandle(run_dir)


def attach(run_dir: str) -> JobHandle:
    """A handle on the job in ``run_dir`` (running or finished), e.g. after a notebook's kernel restarted.

    Args:
        run_dir: the job's run directory.

    Raises:
        ConfigError: ``run_dir`` is not a job's run directory.
    """
    open_run(run_dir)
    return JobHandle(run_dir)


def status_json(run_dir: str) -> str:
    """``monarch-ft status --json``: :meth:`JobHandle.status` as JSON."""
    return json.dumps(attach(run_dir).status(), indent=2)
