"""Ranks as local OS processes: the embedded default launcher."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Optional

from monarch_ft.launcher.base import Launcher, RankLaunch, RankProcess

_PR_SET_PDEATHSIG = 1


def _die_with_supervisor() -> None:
    """Runs in the child before exec: if the supervisor dies, the kernel kills the rank."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class LocalProcess(RankProcess):
    def __init__(self, launch: RankLaunch, proc: subprocess.Popen) -> None:
        self.launch = launch
        self.proc = proc

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class LocalLauncher(Launcher):
    name = "local"

    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        started: list[RankProcess] = []
        try:
            for r in ranks:
                os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
                with open(r.log_path, "ab") as log:
                    proc = subprocess.Popen(
                        r.argv,
                        env=r.env,
                        cwd=r.cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        # Own session: a Ctrl-C in the terminal reaches the supervisor only,
                        # which then stops the ranks itself.
                        start_new_session=True,
                        preexec_fn=_die_with_supervisor,
                    )
                started.append(LocalProcess(r, proc))
        except Exception:
            for p in started:
                p.kill()
            raise
        return started


def build(cfg, run_dir: str) -> LocalLauncher:
    if cfg.options:
        raise ValueError(f"launcher=local takes no options, got {sorted(cfg.options)}")
    return LocalLauncher()
