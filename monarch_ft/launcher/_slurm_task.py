"""One Slurm task of a replica group's job: runs its rank and records how the rank ended.

``srun`` starts M copies of ``python -m monarch_ft.launcher._slurm_task MANIFEST`` (see
:mod:`monarch_ft.launcher.slurm`); task ``SLURM_PROCID`` is rank ``SLURM_PROCID`` of the
manifest. The wrapper exists because Slurm alone cannot tell the supervisor, per rank and
without slurmdbd, whether a rank exited 3 or was SIGKILLed: it runs the rank's argv as its
child, writes ``<log>.pid`` (node, host, pids) once the rank runs and ``<log>.exit`` (the
child's code, negative for a signal, as :mod:`subprocess` reports it) when it ends, both
whole (:func:`~monarch_ft.records.layout.atomic_write`) because the supervisor polls them.

It imports nothing outside the standard library and this package (it is run with ``-S``,
no site-packages), so a task starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from monarch_ft.common.cpu_priority import to_background
from monarch_ft.common.process import die_with_parent, pid_space, start_ticks
from monarch_ft.records.layout import atomic_write, atomic_write_json

# Slurm's view of the task, passed on to the rank next to the rank's own environment.
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_LOCALID")
# Slurm signals every process of the task (the rank is in this process group and tree);
# the wrapper survives the catchable ones so that it can record how the rank ended.
_SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def _rank_env(spec: dict) -> dict[str, str]:
    env = dict(spec["env"])
    env.update({key: os.environ[key] for key in _SLURM_VARS if key in os.environ})
    return env


def _supervisor_watch(manifest: dict, spec: dict, host: str):
    """A check that the supervisor still lives when it runs in this pid space (this machine,
    or a simulated node on it; else always True),
    for a rank that dies with its controller (a waiting warm standby). A training rank
    outlives it: a new controller re-adopts its job by job id (controller.attach), or the
    rank's lease ends it (rank.components.lease); so does a standby once promoted (its
    promotion file written), which from then on trains as its group."""
    here = manifest.get("supervisor_pid_space") == pid_space() if manifest.get("supervisor_pid_space") else manifest.get("supervisor_host") == host
    pid = manifest.get("supervisor_pid") if here and spec.get("die_with_controller") else None
    started = start_ticks(pid) if pid else None
    promotion = spec.get("promotion_path")
    return lambda: started is None or start_ticks(pid) == started or bool(promotion and os.path.exists(promotion))


def run_task(manifest_path: str) -> int:
    """Run this task's rank to its end; returns the code the task itself exits with."""
    with open(manifest_path) as f:
        manifest = json.load(f)
    procid = int(os.environ.get("SLURM_PROCID", "0"))
    spec = manifest["ranks"][procid]
    for sig in _SURVIVED:
        signal.signal(sig, lambda *_: None)
    niceness = int(spec.get("niceness") or 0)

    def preexec() -> None:
        # The rank dies with this wrapper, whatever kills it; and runs at its niceness
        # (RankLaunch.niceness: a warm standby below the training ranks).
        die_with_parent()
        if niceness:
            to_background(niceness)

    with open(spec["log_path"], "ab") as log:
        child = subprocess.Popen(
            spec["argv"], env=_rank_env(spec), cwd=spec["cwd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=preexec
        )
    host = socket.gethostname()
    info = {
        "pid": child.pid,
        "wrapper_pid": os.getpid(),
        "wrapper_start": start_ticks(os.getpid()),
        "host": host,
        "node": os.environ.get("SLURMD_NODENAME", host),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "procid": procid,
        # Which pids this task's are (its pids are watched from where the same holds).
        "pid_space": pid_space(),
        # When the rank started: its job's allocation time is this less the submission.
        "started": time.time(),
    }
    atomic_write_json(spec["pid_path"], info)
    supervisor_alive = _supervisor_watch(manifest, spec, host)
    while True:
        try:
            code = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        if not supervisor_alive():
            child.kill()
    atomic_write(spec["exit_path"], str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run_task(sys.argv[1]))
