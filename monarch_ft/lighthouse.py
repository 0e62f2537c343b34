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

from monarch_ft.config import ConfigError, FTConfig
from monarch_ft.process import die_with_parent
from monarch_ft.net import free_port, host_port, port_in_use, reachable


def lighthouse_binary() -> str:
    candidates = [os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"), shutil.which("torchft_lighthouse")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise RuntimeError("torchft_lighthouse not found: install torchft (pip install torchft==0.2.0) in this environment")


class Lighthouse:
    def __init__(self, cfg: FTConfig, log_path: str, host: str | None = None) -> None:
        """``host``: where to listen (default ``ft.lighthouse_host``); a launcher whose ranks
        run elsewhere (other hosts, network namespaces) names an address they can reach."""
        self.cfg = cfg
        self.host = host or cfg.lighthouse_host
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self, timeout_s: float = 15.0) -> str:
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
        port = cfg.lighthouse_port or free_port(host)
        if cfg.lighthouse_port and port_in_use(host, port):
            raise ConfigError(f"ft.lighthouse_port={port} is already in use on {host}: pick another port, or 0 for a free one")
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        argv = [
            lighthouse_binary(),
            "--bind", bind,
            "--min_replicas", str(cfg.min_replica_size),
            "--join_timeout_ms", str(cfg.join_timeout_ms),
            "--quorum_tick_ms", str(cfg.quorum_tick_ms),
            "--heartbeat_timeout_ms", str(cfg.heartbeat_timeout_ms),
        ]
        log = open(self.log_path, "ab")
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")}
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                tail = open(self.log_path, errors="replace").read()[-500:]
                raise RuntimeError(f"the Lighthouse exited with code {self.proc.returncode} at start (log {self.log_path}): {tail.strip()}")
            if reachable(host, port, timeout=0.5):
                self.address = f"http://{host}:{port}"
                return self.address
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Lighthouse did not listen on {bind} within {timeout_s:.0f}s (log {self.log_path})")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
