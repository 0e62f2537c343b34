"""The TorchFT Lighthouse, as torchft ships it (the ``torchft_lighthouse`` server).

It runs as its own process so that its quorum log (INFO on stderr, one line per
quorum) goes to a file in the run directory, and so the supervisor can watch it
like any other process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil

from monarch_ft.common.net import free_port, host_port, port_in_use, reachable
from monarch_ft.common.process import is_running, on_python_path, start_ticks
from monarch_ft.config.ft import FTConfig
from monarch_ft.records.errors import ConfigError

# The guard the server runs under (by module path: it is a process of its own, and light).
GUARD_MODULE = "monarch_ft.controller.lighthouse_guard"


def lighthouse_binary() -> str:
    candidates = [os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"), shutil.which("torchft_lighthouse")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise RuntimeError("torchft_lighthouse not found: install torchft (pip install torchft==0.2.0) in this environment")


def lighthouse_argv() -> tuple[list[str], dict[str, str]]:
    """The command (and environment) that runs torchft's Lighthouse server: its extension
    alone where it can be found (monarch_ft/controller/_lighthouse_server.py: starts in well under a
    second, not the 10-30 s of importing torch), else torchft's own script."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("torchft")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for so in sorted(glob.glob(os.path.join(folder, "_torchft*.so"))):
            return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lighthouse_server.py")], {"MONARCH_FT_TORCHFT_SO": so}
    return [lighthouse_binary()], {}


class Lighthouse:
    """The job's Lighthouse: started (through :mod:`monarch_ft.controller.lighthouse_guard`), watched,
    restarted on the same address when it dies, and taken over by a new controller.

    Args:
        cfg: the ``ft`` section.
        log_path: where the server's output goes.
        host: where to listen (default ``ft.lighthouse_host``); a launcher whose ranks run
            elsewhere (other hosts, network namespaces) names an address they can reach.
        guard: ``(run_dir, lease_s, heartbeat_s)``: run the server under the guard, which
            ends it once the job has ended without a controller. None: a bare server.
    """

    def __init__(self, cfg: FTConfig, log_path: str, host: str | None = None, guard: tuple[str, float, float] | None = None) -> None:
        self.cfg = cfg
        self.host = host or cfg.lighthouse_host
        self.log_path = log_path
        self.guard = guard
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.port = 0
        # A Lighthouse a previous controller started: (guard, server) identities.
        self._adopted: tuple[tuple[int, str | None], tuple[int, str | None]] | None = None
        self._server: tuple[int, str | None] | None = None

    def start(self, timeout_s: float = 15.0, port: int = 0) -> str:
        """Start the Lighthouse (on ``port``, else ``ft.lighthouse_port``, else a free port)."""
        cfg = self.cfg
        if cfg.lighthouse_addr:
            host, port = host_port(cfg.lighthouse_addr)
            if not reachable(host, port):
                raise ConfigError(
                    f"cannot reach the Lighthouse at {cfg.lighthouse_addr}: start it there, or unset ft.lighthouse_addr to let the supervisor start one"
                )
            self.address = f"http://{host}:{port}"
            return self.address
        host = self.host
        restart = bool(port)
        port = port or cfg.lighthouse_port or free_port(host)
        if cfg.lighthouse_port and not restart and port_in_use(host, port):
            raise ConfigError(f"ft.lighthouse_port={port} is already in use on {host}: pick another port, or 0 for a free one")
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        server, server_env = lighthouse_argv()
        argv = [
            *server,
            "--bind",
            bind,
            "--min_replicas",
            str(cfg.min_replica_size),
            "--join_timeout_ms",
            str(cfg.join_timeout_ms),
            "--quorum_tick_ms",
            str(cfg.quorum_tick_ms),
            "--heartbeat_timeout_ms",
            str(cfg.heartbeat_timeout_ms),
        ]
        if self.guard is not None:
            run_dir, lease_s, heartbeat_s = self.guard
            argv = [sys.executable, "-m", GUARD_MODULE, run_dir, str(lease_s), str(heartbeat_s), "--", *argv]
        log = open(self.log_path, "ab")
        env = on_python_path({**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), **server_env})
        # Not tied to the supervisor's life: a new controller takes it over (the guard ends it
        # when the job ended without one). Its own session: a terminal's Ctrl-C is the
        # supervisor's to act on.
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log.close()
        self._adopted, self._server = None, None
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                tail = open(self.log_path, errors="replace").read()[-500:]
                raise RuntimeError(f"the Lighthouse exited with code {self.proc.returncode} at start (log {self.log_path}): {tail.strip()}")
            if reachable(host, port, timeout=0.5):
                self.address, self.port = f"http://{host}:{port}", port
                return self.address
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Lighthouse did not listen on {bind} within {timeout_s:.0f}s (log {self.log_path})")

    def restart(self, timeout_s: float = 30.0) -> str:
        """Start it again on the same address (the ranks' Managers know only that one)."""
        self.stop()
        return self.start(timeout_s=timeout_s, port=self.port)

    def adopt(self, address: str, guard_pid, guard_start, server_pid, server_start) -> dict:
        """Take over the Lighthouse a previous controller started; returns {"alive", "pid"}."""
        self.proc = None
        if address:
            self.address = address
            self.host, self.port = host_port(address)
        if guard_pid:
            self._adopted = ((guard_pid, guard_start), (server_pid, server_start))
            self._server = (server_pid, server_start)
        return {"alive": self.alive(), "pid": server_pid, "address": self.address}

    def _server_identity(self) -> tuple[int, str | None] | None:
        """The torchft_lighthouse process itself (the guard's child)."""
        if self._server is None and self.proc is not None:
            if self.guard is None:
                self._server = (self.proc.pid, start_ticks(self.proc.pid))
            else:
                try:
                    children = psutil.Process(self.proc.pid).children()
                except psutil.Error:
                    children = []
                if children:
                    self._server = (children[0].pid, start_ticks(children[0].pid))
        return self._server

    def identity(self) -> dict:
        """What a new controller needs to take this Lighthouse over."""
        guard = (self.proc.pid, start_ticks(self.proc.pid)) if self.proc is not None else (self._adopted[0] if self._adopted else (None, None))
        server = self._server_identity() or (None, None)
        return {"guard_pid": guard[0], "guard_start": guard[1], "server_pid": server[0], "server_start": server[1], "port": self.port}

    @property
    def pid(self) -> int | None:
        """The server's pid (what a ``lighthouse`` drill fault kills)."""
        server = self._server_identity()
        return server[0] if server else (self.proc.pid if self.proc else None)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self._adopted is not None:
            (gp, gs), (sp, ss) = self._adopted
            return is_running(gp, gs) and (not sp or is_running(sp, ss))
        return True  # ft.lighthouse_addr: not ours to watch

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def stop(self) -> None:
        if self.proc is None:
            if self._adopted is not None:
                for pid, start in self._adopted:
                    if pid and start_ticks(pid) == start:
                        try:
                            os.kill(pid, 15)
                        except OSError:
                            pass
                deadline = time.time() + 5  # gone (its port free) before the job says it ended
                while time.time() < deadline and any(is_running(pid, start) for pid, start in self._adopted):
                    time.sleep(0.02)
            return
        server = self._server_identity()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The server dies with its guard (PR_SET_PDEATHSIG): wait until its port is free.
        deadline = time.time() + 5
        while server and is_running(*server) and time.time() < deadline:
            time.sleep(0.02)
