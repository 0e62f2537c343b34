"""Warm fork, the controller's side: relaunched ranks forked from a parent that has already imported everything.

A cold relaunch (no warm standby ready: two faults close together, or ``ft.standby_groups=0``)
spends most of its time in a fresh interpreter importing torch, TorchTitan and TorchFT. A
*fork server* (a "zygote", as Android starts its apps: :mod:`monarch_ft.rank.zygote`) does
those imports once, at launch, and then waits; a relaunch asks it to ``fork()`` each rank,
which then runs exactly what ``python -m monarch_ft.rank.worker SPEC`` runs, minus the imports
(:data:`RecoveryPath.WARM_FORK`). Why the server does nothing but import (fork safety) is
said there; the messages both sides exchange are :mod:`monarch_ft.records.fork_wire`.

Where it runs: one fork server per host the launcher places ranks on (``Launcher.fork_host``):
one for ``launcher=local``, one per simulated host for ``local_hosts``, started inside that
host's network, mount and UTS namespaces (``ip netns exec``, the host's name), because a
forked process stays in its parent's namespaces. Other launchers start ranks through an
engine (Slurm, Monarch): their relaunches stay cold, and the ``recovery_path`` event says why.

A forked rank is the server's child, not the controller's: its exit status comes back
through the server (``exited``); signals, psutil and /proc go to its pid as for any rank.
If the server dies, its children are re-parented (to init) and watched by pid and start
time, as a new controller watches adopted ranks
(:class:`monarch_ft.launcher.base.AdoptedProcess`); the server is restarted, and relaunches
meanwhile start cold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from monarch_ft.common.process import is_running, start_ticks
from monarch_ft.controller.snapshot import own
from monarch_ft.launcher.base import ForkHost, Launcher, RankLaunch, RankProcess
from monarch_ft.records.events import RecoveryPath, StrEnum
from monarch_ft.records.exits import LOST_EXIT
from monarch_ft.records.fork_wire import FORK_NICE_ENV, ForkOp, ProtocolError, decode, encode
from monarch_ft.records.launch import ZYGOTE_MODULE, worker_spec
from monarch_ft.records.reports import report_finished

# What a rank imports before it reads its spec (monarch_ft.rank.worker -> monarch_ft.rank.trainer) and
# what the trainer imports lazily while building: everything whose import a relaunch skips.
# Imports only: see monarch_ft.rank.zygote on fork safety.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint.state_dict",
    "omegaconf",
    "torchtitan.components.lr_scheduler",
    "torchtitan.components.optimizer",
    "torchtitan.components.checkpoint",
    "torchtitan.config.job_config",
    "torchtitan.models.llama3.infra.parallelize",
    "torchft",
    "torchft.process_group",
    "torchft.local_sgd",
    "torchft.checkpointing.http_transport",
    "monarch_ft.rank.worker",
    "monarch_ft.rank.trainer",
    "monarch_ft.rank.standby_wait",
    "monarch_ft.transport.factory",
    "monarch_ft.transport.sharded",
    "monarch_ft.transport.interface",
)
# How long the supervisor waits for the server to answer one fork.
FORK_REPLY_TIMEOUT_S = 10.0
# How long a poll that finds a forked rank gone waits for the server's report of its exit
# (ForkServer.wait_exit): the server reaps on SIGCHLD and writes at once, so this is the
# controller's own reader thread catching up, or the server's next turn on a busy machine.
EXIT_REPORT_WAIT_S = 1.0
# A server that dies before it is ready this many times in a row on one host is not restarted.
MAX_FAILED_STARTS = 3
# How long a job's first launch waits for its host's server to be ready before it starts the
# ranks cold: a server that imports for longer than the ranks would (~15 s under load here) is
# stuck, and must not hold the job's start up.
FIRST_LAUNCH_WAIT_S = 60.0


class ServerState(StrEnum):
    STARTING = "starting"  # importing
    READY = "ready"
    GONE = "gone"  # exited or closed


# ---------------------------------------------------------------- pure parts


def never_forked(recovery: str, warm_fork: bool, launcher_problem: Optional[str]) -> Optional[str]:
    """Why no rank of this job is ever forked, whatever its fork servers do (None: ranks may be).

    Args:
        recovery: ``ft.recovery``; the ``full_restart`` baseline keeps its meaning (cold).
        warm_fork: ``ft.warm_fork``.
        launcher_problem: why the launcher cannot fork ranks (None: it can).
    """
    if recovery == "full_restart":
        return "ft.recovery=full_restart (the baseline starts every rank cold)"
    if not warm_fork:
        return "ft.warm_fork=false"
    return launcher_problem or None


def relaunch_path(recovery: str, warm_fork: bool, launcher_problem: Optional[str], server: Optional[ServerState]) -> tuple[RecoveryPath, Optional[str]]:
    """How a group relaunched without a standby comes up, and why not warm when it is cold.

    Args:
        recovery: ``ft.recovery``; the ``full_restart`` baseline keeps its meaning (cold).
        warm_fork: ``ft.warm_fork``.
        launcher_problem: why the launcher cannot fork ranks (None: it can).
        server: the state of the fork server on the group's host (None: there is none).
    """
    never = never_forked(recovery, warm_fork, launcher_problem)
    if never is not None:
        return RecoveryPath.COLD_START, never
    if server is ServerState.READY:
        return RecoveryPath.WARM_FORK, None
    if server is ServerState.STARTING:
        return RecoveryPath.COLD_START, "the fork server is still importing"
    return RecoveryPath.COLD_START, "no fork server on the group's host (gone; restarting)"


def first_launch_path(
    recovery: str, warm_fork: bool, launcher_problem: Optional[str], server: Optional[ServerState], exhausted: bool, waited_s: float
) -> Optional[tuple[RecoveryPath, Optional[str]]]:
    """How a group's first launch starts, and why cold; None: not yet (wait for the server).

    Why the first launch is forked too: a rank's own start is mostly its imports (torch,
    TorchTitan, TorchFT: ~4 s of CPU each here); the ranks of a host import the same modules
    side by side, on the same cores, and the host's fork server imports them once more beside
    them. Waiting for the server and forking from it imports once per host (on 2 cores a 2 x 2
    job trained from 4.75 s after its start instead of 9.5 s cold: docs/results/first-launch.md).

    Args:
        recovery: ``ft.recovery``; the ``full_restart`` baseline starts every rank cold.
        warm_fork: ``ft.warm_fork``.
        launcher_problem: why the launcher cannot fork ranks (None: it can).
        server: the state of the fork server on the group's host (None: none yet, or gone).
        exhausted: the host's server died before it was ready too often (no more are started).
        waited_s: how long this launch has waited for the server so far.
    """
    never = never_forked(recovery, warm_fork, launcher_problem)
    if never is not None:
        return RecoveryPath.COLD_START, never
    if server is ServerState.READY:
        return RecoveryPath.WARM_FORK, None
    if exhausted:
        return RecoveryPath.COLD_START, f"the fork server on its host died {MAX_FAILED_STARTS} times before it was ready"
    if waited_s >= FIRST_LAUNCH_WAIT_S:
        return RecoveryPath.COLD_START, f"the fork server on its host was still importing after {waited_s:.0f} s"
    return None


class ForkError(RuntimeError):
    """A fork the server did not make (the relaunch starts cold instead)."""


class ForkServer:
    """The supervisor's handle on one fork server: start it, ask it for ranks, read their exits.

    Args:
        host: where it runs (the launcher's :class:`ForkHost`).
        env: its environment (the ranks' own: see the module docstring).
        log_path: its own output.
        cwd: its working directory, the run directory (named in its command line).
        preload: the modules it imports before it is ready.
        niceness: the CPU niceness of its imports (0: the ranks'); it takes 0 back once ready,
            where it may (CAP_SYS_NICE), and else imports at 0 (its forks must not train niced).
    """

    def __init__(self, host: ForkHost, env: dict[str, str], log_path: str, cwd: str, preload: Iterable[str] = (), niceness: int = 0) -> None:
        self.host = host
        self.log_path = log_path
        self.state = ServerState.STARTING
        self.ready_info: dict = {}
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict] = {}
        self._next_id = 0
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        # A wait for an exit report timed out: none waits again until the next report arrives.
        self._late = False
        # numpy's OpenBLAS starts its thread pool when it loads, sized from OMP_NUM_THREADS
        # (the ranks' training.threads_per_rank): one thread, no pool, in the server. A forked
        # rank keeps it (numpy only slices token batches; torch's own threads are set by the
        # trainer), where a cold rank with threads_per_rank > 1 would have a pool there.
        env = {**env, "OPENBLAS_NUM_THREADS": env.get("OPENBLAS_NUM_THREADS", "1")}
        if niceness:
            env[FORK_NICE_ENV] = str(niceness)
        ours, theirs = socket.socketpair()
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [*host.argv_prefix, sys.executable, "-m", ZYGOTE_MODULE, str(theirs.fileno()), cwd, *preload],
                    env=env,
                    cwd=cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                    # It dies with this controller (a controller that attaches starts its own).
                    preexec_fn=host.preexec,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self.started_at = time.time()
        self._reader = threading.Thread(target=self._read, name=f"forkserver-{host.key}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        f = self._sock.makefile("rb")
        try:
            for line in f:
                try:
                    msg = decode(line)
                except ProtocolError:
                    continue
                with self._cond:
                    if msg["op"] is ForkOp.READY:
                        self.ready_info = {k: msg[k] for k in ("pid", "import_s", "threads", "import_niceness")}
                        self.state = ServerState.READY
                    elif msg["op"] is ForkOp.EXITED and msg["id"] is not None:
                        self._exits[msg["id"]] = msg["code"]
                        self._late = False
                    elif msg["op"] in (ForkOp.FORKED, ForkOp.REFUSED):
                        self._replies[msg["id"]] = msg
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._cond:
                self.state = ServerState.GONE
                self._cond.notify_all()

    def exit_code(self, rid: int) -> Optional[int]:
        """The exit code the server reported for fork ``rid``, or None (running, or unknown)."""
        with self._cond:
            return self._exits.get(rid)

    def wait_exit(self, rid: int, timeout: float) -> Optional[int]:
        """The exit code of fork ``rid``, a child known to be gone, waited for up to ``timeout``
        seconds (None: not reported by then, or the server is gone without a report).

        The server has reaped it, or soon will, and its report may still be in the channel,
        unread by this process's reader thread: after a pause of the controller (a SIGSTOP, a
        starved machine) the reports of ranks that died together are read one at a time,
        while the tick goes on. A tick that saw one of them exited and took the other for
        alive would count a dead group as a live peer to heal from. A wait that times out
        marks the server late (stopped or starved): no wait on it again until its next report
        arrives, so a hung server costs one wait, not one per tick.

        Args:
            rid: the fork's request id.
            timeout: the longest wait, in seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._exits and self.state is not ServerState.GONE and not self._late:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._late = True
                    break
                self._cond.wait(left)
            return self._exits.get(rid)

    def fork(
        self, launch: RankLaunch, die_with_parent: bool, report_path: str = "", timeout: float = FORK_REPLY_TIMEOUT_S, netns: Optional[str] = None
    ) -> "ForkedProcess":
        """Start ``launch`` as a child of the server (``report_path``: its report file, read
        for its verdict should the server die before it; ``netns``: the simulated host the
        child enters first, where this server runs on another one: :attr:`ForkHost.netns`).

        Raises:
            ForkError: the server refused, is gone, or did not answer within ``timeout``.
        """
        with self._cond:
            if self.state is not ServerState.READY:
                raise ForkError(f"the fork server is {self.state}")
            rid = self._next_id
            self._next_id += 1
        request = dict(
            id=rid, argv=launch.argv, env=launch.env, cwd=launch.cwd, log_path=launch.log_path, die_with_parent=die_with_parent, niceness=launch.niceness
        )
        if netns is not None:
            request["netns"] = netns
        try:
            with self._send_lock:
                self._sock.sendall(encode(ForkOp.FORK, **request))
        except OSError as e:
            raise ForkError(f"the fork server's channel is closed ({e})") from None
        deadline = time.time() + timeout
        with self._cond:
            while rid not in self._replies:
                left = deadline - time.time()
                if self.state is ServerState.GONE or left <= 0:
                    raise ForkError("the fork server is gone" if self.state is ServerState.GONE else f"no answer from the fork server in {timeout:g}s")
                self._cond.wait(left)
            reply = self._replies.pop(rid)
        if reply["op"] is ForkOp.REFUSED:
            raise ForkError(f"the fork server refused: {reply['error']}")
        return ForkedProcess(launch, self, rid, reply["pid"], report_path)

    def alive(self) -> bool:
        return self.state is not ServerState.GONE and self.proc.poll() is None

    def close(self) -> None:
        """Stop the server (its forked ranks are left alone: the supervisor stops those)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5.0)
        self._reader.join(2.0)


class ForkedProcess(RankProcess):
    """A rank forked by a fork server: signalled and probed by pid like any local rank; its
    exit code is the one the server reaped. With the server gone, it is an orphan adopted
    by init: watched by pid and start time, its status read from its report
    (as :class:`monarch_ft.launcher.base.AdoptedProcess`)."""

    forked = True

    def __init__(self, launch: RankLaunch, server: ForkServer, rid: int, pid: int, report_path: str = "") -> None:
        self.launch = launch
        self.report_path = report_path
        self.server = server
        self.rid = rid
        self._pid = pid
        self._start = start_ticks(pid)
        self._code: Optional[int] = None

    @property
    def pid(self) -> Optional[int]:
        return self._pid

    def poll(self) -> Optional[int]:
        """The exit code, as :meth:`RankProcess.poll`. A rank found gone has its code read in
        this very poll (:meth:`ForkServer.wait_exit`): ranks that died together are then seen
        exited in one tick, as the local launcher's own children are (CI at 4d09a38: a group's
        standby was told to heal from the other group, dead, its exit not yet read)."""
        if self._code is None:
            self._code = self.server.exit_code(self.rid)
        if self._code is None and not is_running(self._pid, self._start):
            # The server's last words are read before GONE, so a gone server's silence is final.
            self._code = self.server.wait_exit(self.rid, EXIT_REPORT_WAIT_S)
            if self._code is None and self.server.state is ServerState.GONE:
                self._code = 0 if self.report_path and report_finished(self.report_path) else LOST_EXIT
        return self._code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self._pid, sig)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------- one per host, for the controller
@dataclass
class ForkPoolState:
    """What the job knows of its fork servers beyond the live ones (each dies with the
    controller that started it; one that attaches starts its own): per host, how many were
    started (their log files are numbered by it) and how many died in a row before they
    were ready (at MAX_FAILED_STARTS the host gets none). Part of the job's state
    (:class:`monarch_ft.controller.state.JobState`)."""

    starts: dict[str, int] = field(default_factory=dict)
    failed_starts: dict[str, int] = field(default_factory=dict)
    # The servers (by pid) whose readiness this controller wrote (fork_server_ready, once each).
    announced: set[int] = own(default_factory=set)


class WarmForks:
    """The supervisor's fork servers: one per host its groups run on, started at launch,
    restarted when one dies, asked for a relaunched group's ranks (``ft.warm_fork``).

    Args:
        enabled: ``ft.warm_fork`` and not the ``full_restart`` baseline.
        launcher: places the servers (``Launcher.fork_host``).
        log_path: a server's log file, by host key and start number (RunLayout.fork_server_log).
        env: the ranks' environment (monarch_ft.controller.launch.rank_env).
        cwd: the servers' working directory (the run directory).
        preload: modules every server imports besides :data:`PRELOAD` (the job's model package).
        state: the job's :class:`ForkPoolState` (a new one when not given).
        server: what starts one server (:class:`ForkServer`; the tests' fake launcher gives its own).
        niceness: the niceness a server starting now imports at (ForkServer's ``niceness``):
            the loop's rule is below the ranks once the job trains, so a new host's server
            (a promoted standby's) does not take the training ranks' CPU for its ~16 s of
            imports when host and job share cores, as here.
    """

    def __init__(
        self,
        enabled: bool,
        launcher: Launcher,
        log_path: Callable[[str, int], str],
        env: Callable[[], dict[str, str]],
        cwd: str,
        preload: Iterable[str] = (),
        state: Optional[ForkPoolState] = None,
        server: Callable[..., Any] = ForkServer,
        niceness: Callable[[], int] = lambda: 0,
    ) -> None:
        self.enabled = enabled
        self.launcher = launcher
        self._log_path = log_path
        self._env = env
        self._cwd = cwd
        self._preload = (*PRELOAD, *preload)
        self._server = server
        self._niceness = niceness
        self.servers: dict[str, ForkServer] = {}
        self.state = state if state is not None else ForkPoolState()

    def problem(self) -> Optional[str]:
        """Why this launcher's ranks cannot be forked, first launch or relaunch (None: they can)."""
        if not self.launcher.traits.forkable:
            return f"launcher={self.launcher.name} starts ranks through its engine (no warm fork): every launch starts cold"
        return None

    def _host(self, group: int) -> Optional[ForkHost]:
        return self.launcher.fork_host(group) if self.enabled else None

    def start_server(self, group: int, n: int) -> None:
        """Start the fork server of ``group``'s host (its ``n``-th there), importing at the
        niceness the loop's rule gives now."""
        host = self._host(group)
        if host is None:
            return
        self.servers[host.key] = self._server(host, self._env(), self._log_path(host.key, n), self._cwd, self._preload, niceness=self._niceness())

    def close_server(self, key: str) -> None:
        """Close and forget the server of host ``key`` (it died)."""
        server = self.servers.pop(key, None)
        if server is not None:
            server.close()

    def pending(self) -> bool:
        """A server of this job is still importing (a drill waits for it, as for a standby)."""
        return any(s.state is ServerState.STARTING for s in self.servers.values())

    def server_state(self, group: int) -> Optional[ServerState]:
        """The state of the fork server on ``group``'s host now (None: there is none)."""
        host = self._host(group)
        server = self.servers.get(host.key) if host is not None else None
        return server.state if server is not None and server.alive() else None

    def _any_host_server(self, host: Optional[ForkHost]) -> Optional[ForkServer]:
        """A ready server of another host that can fork for ``host`` (a simulated host on this
        machine: :attr:`ForkHost.netns`), the first by host key; None if none can."""
        if host is None or host.netns is None:
            return None
        ready = [s for k, s in sorted(self.servers.items()) if k != host.key and s.state is ServerState.READY and s.alive()]
        return ready[0] if ready else None

    def can_fork(self, group: int, any_host: bool = False) -> bool:
        """A fork for ``group``'s host can be asked now: its own server is ready, or (``any_host``)
        a ready server of another simulated host on this machine would fork it."""
        host = self._host(group)
        if host is None:
            return False
        own = self.servers.get(host.key)
        if own is not None and own.state is ServerState.READY and own.alive():
            return True
        return any_host and self._any_host_server(host) is not None

    def launch_group(self, launches: list[RankLaunch], any_host: bool = False) -> list[RankProcess]:
        """Fork every rank of one group from its host's server (all or none); with ``any_host``,
        where that one is not ready, from a ready server of another simulated host, the ranks
        entering their own host's namespaces after the fork (a standby: its host is new and has
        no server, and a cold build beside the training ranks takes them half a minute of CPU).

        Raises:
            ForkError: a rank could not be forked; those already forked are killed and reaped.
        """
        host = self._host(launches[0].group)
        server = self.servers.get(host.key) if host is not None else None
        netns = None
        if any_host and (server is None or server.state is not ServerState.READY or not server.alive()):
            other = self._any_host_server(host)
            if other is not None:
                server, netns = other, host.netns
        if server is None:
            raise ForkError("no fork server on the group's host")
        started: list[ForkedProcess] = []
        try:
            for r in launches:
                r.host = host.host
                env = dict(r.env)
                for k, v in host.rank_env.items():
                    env.setdefault(k, v)
                with open(worker_spec(r.argv) or os.devnull) as f:
                    report = (json.loads(f.read() or "{}")).get("report_path", "")
                forked = server.fork(dataclasses.replace(r, env=env), r.die_with_controller, report, netns=netns)
                forked.launch = r
                started.append(forked)
        except ForkError:
            for p in started:
                p.kill()
                p.wait(5.0)
            raise
        return started

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()
