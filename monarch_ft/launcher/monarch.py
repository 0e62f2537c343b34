"""Ranks as Monarch actors: one proc mesh per replica group (``launcher=monarch``).

Each launch of a group spawns a fresh proc mesh of M procs (``spawn_procs(per_host={"procs": M})``
on this host by default, or on the hosts of a Monarch ``SlurmJob`` with ``allocator: slurm``) and
one ``RankActor`` per proc (:data:`~monarch_ft.records.launch.RANK_ACTOR`, the rank side's
:mod:`monarch_ft.rank.monarch_actor`, named by its module path as every launcher names the rank's
worker module, never imported here); its ``run(spec_path)`` endpoint calls
``monarch_ft.rank.trainer.train`` and the launcher holds that call's future.

How a rank's fate is known (:meth:`MonarchRank.poll`), most precise first:

1. the ``run`` future: a value is a clean exit (0); an ``ActorError`` (train() raised) is 1;
2. the exit status of the proc's own process, recorded by the tiny ``sh`` each proc is
   bootstrapped under (``$?`` of the Python proc: 128+N becomes -N, as subprocess reports a
   signal); this gives the real signal of a SIGKILL/SIGSEGV at once;
3. Monarch's supervision: the ``run`` future failing with a ``SupervisionError`` or a
   ``MeshFailure`` delivered to the client (``unhandled_fault_hook``), whose report carries
   ``Killed(sig=N)`` or ``exited with non-zero code N`` and the rank's point;
4. the pid is gone and none of the above arrived within ``exit_grace_s``: 1.

Monarch's own supervision alone is too slow and, with a short poll, not reliable enough here
(its actor-mesh poll defaults to ~10 s; at 1 s it sometimes missed a SIGKILL on 2 loaded cores),
hence (2). Pids come from the actors themselves (``info()``: the proc's ``os.getpid()`` and its
wrapper's pid), so a fault injector, psutil and the supervisor's hang check see the real process.

``kill()`` on any rank stops the whole group: SIGKILL to every local process of the mesh, then
``ProcMesh.stop()``, then a check that the processes are gone. A group whose ranks all returned
ends its procs itself: ``os._exit(0)`` ``exit_after_return_s`` after replying, as ``monarch_ft.rank.worker``
does (train() leaves torchft threads behind, which made a graceful ``ProcMesh.stop()`` take up to
~8 s), and the mesh is then stopped in the background.

Known weak spot: the Monarch controller is this launcher's process, i.e. the supervisor. It owns
every proc mesh and receives all supervision, and no other process can talk to its actors, so a
new controller cannot take the job over (:meth:`MonarchLauncher.adoption_problem`). Seen here: a
SIGKILLed controller does not take its procs with it (``mesh_bootstrap_enable_pdeathsig`` did
not end them); their ranks train on unsupervised until their lease ends them with a checkpoint
(``controller.lease_s``, monarch_ft.rank.components.lease), and a waiting warm standby gives up when the
controller's heartbeat goes stale (monarch_ft.rank.standby_wait). The job resumes from those checkpoints.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import psutil

from monarch_ft.config.unused import refuse_unused
from monarch_ft.launcher.base import Launcher, LauncherOptions, LauncherTraits, RankLaunch, RankProcess
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.launch import RANK_ACTOR, RANK_ENTRY, WORKER_MODULE

log = logging.getLogger("monarch_ft.launcher.monarch")

DEFAULT_ENTRY = RANK_ENTRY

ALLOCATORS = ("local", "slurm")


@dataclass
class SlurmJobOptions:
    """``launcher.options.slurm``: monarch.job.SlurmJob's settings for ``allocator=slurm``
    (None: SlurmJob's own default)."""

    nodes_per_group: int = 1
    """Hosts in each group's allocation."""

    partition: Optional[str] = None
    """Slurm partition (``sbatch --partition``)."""

    time_limit: Optional[str] = None
    """``sbatch --time``, e.g. ``"01:00:00"``."""

    slurm_args: List[str] = field(default_factory=list)
    """Extra sbatch arguments."""

    job_name: Optional[str] = None
    """The allocation's job name; null: ``monarch_ft_g<group>``."""

    account: Optional[str] = None
    """``sbatch --account``."""

    qos: Optional[str] = None
    """``sbatch --qos``."""

    job_start_timeout: Optional[int] = None
    """Seconds SlurmJob waits for the allocation to start (SlurmJob's default: forever)."""

    monarch_port: Optional[int] = None
    """Port of the Monarch process on each allocated host (SlurmJob's default: 22222)."""

    exclusive: Optional[bool] = None
    """``sbatch --exclusive``: the allocation's hosts are not shared with other jobs (SlurmJob's default: true)."""

    gpus_per_node: Optional[int] = None
    """GPUs allotted on each host (``sbatch --gpus-per-node``)."""

    cpus_per_task: Optional[int] = None
    """Cores allotted to each task (``sbatch --cpus-per-task``)."""

    mem: Optional[str] = None
    """``sbatch --mem``, e.g. ``"16G"``."""

    def job_kwargs(self, group: int) -> dict[str, Any]:
        """Keyword arguments of SlurmJob for ``group`` (what is unset is left to SlurmJob)."""
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k != "nodes_per_group"}
        given.setdefault("job_name", f"monarch_ft_g{group}")
        return given


@dataclass
class Options(LauncherOptions):
    """``launcher=monarch``: every replica group a Monarch proc mesh, every rank an actor."""

    allocator: str = "local"
    """Where the procs run: ``local``, on this host (``this_host()``); ``slurm``, each group on the
    hosts of its own SlurmJob."""

    supervision_poll: str = "2s"
    """Monarch's actor-mesh supervision poll (``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY``), a
    duration such as ``2s`` or ``500ms``: how soon a dead proc is seen."""

    spawn_timeout_s: float = 120.0
    """Seconds spawning a group's procs and actors may take, up to the actors answering ``info()``."""

    stop_timeout_s: float = 15.0
    """Seconds ``ProcMesh.stop()`` may take when a group is killed or finished."""

    exit_grace_s: float = 3.0
    """Seconds to wait for a gone rank's exit status before assuming 1."""

    exit_after_return_s: float = 1.0
    """Seconds after replying that a rank whose ``train()`` returned ends its proc with
    ``os._exit(0)`` (as monarch_ft.rank.worker does); 0 leaves it to ``ProcMesh.stop()``."""

    slurm: SlurmJobOptions = field(default_factory=SlurmJobOptions)
    """Settings of ``monarch.job.SlurmJob`` for ``allocator=slurm``; refused with ``allocator=local``."""

    def check(self, launcher: str) -> None:
        if self.allocator not in ALLOCATORS:
            raise ConfigError(f"launcher.options.allocator={self.allocator!r}: choose one of {', '.join(ALLOCATORS)}")
        for key in ("spawn_timeout_s", "stop_timeout_s", "exit_grace_s", "exit_after_return_s"):
            value = getattr(self, key)
            if value < 0 or (value == 0 and key != "exit_after_return_s"):
                raise ConfigError(f"launcher.options.{key}={value}: must be > 0")
        if not re.fullmatch(r"\s*\d+(\.\d+)?\s*(ms|s|m)\s*", self.supervision_poll):
            raise ConfigError(f"launcher.options.supervision_poll={self.supervision_poll!r}: must be a duration like 2s or 500ms")
        if self.slurm.nodes_per_group < 1:
            raise ConfigError(f"launcher.options.slurm.nodes_per_group={self.slurm.nodes_per_group}: must be >= 1")
        if self.allocator != "slurm":
            refuse_unused(
                self.slurm,
                "launcher.options.slurm",
                [f.name for f in dataclasses.fields(self.slurm)],
                f"with launcher.options.allocator={self.allocator} (no Slurm job is made)",
                "drop it, or set launcher.options.allocator=slurm",
            )


# The proc runs under sh: cd, send all output to the rank's log, run the Python proc in the
# foreground at the rank's niceness (RankLaunch.niceness; nice execs it, so the proc is still
# the shell's child and $? its status), under SCHED_IDLE too when niced and chrt is there
# (what monarch_ft.common.cpu_priority.to_background does for the other launchers), record its
# $? atomically, exit with it (Monarch then sees the same status).
_WRAPPER = (
    'cd "$MONARCH_FT_CWD" || exit 97; '
    'exec >>"$MONARCH_FT_LOG" 2>&1 </dev/null; '
    'if [ "${MONARCH_FT_NICE:-0}" != 0 ] && command -v chrt >/dev/null 2>&1; then set -- chrt -i 0 "$0" "$@"; else set -- "$0" "$@"; fi; '
    'nice -n "${MONARCH_FT_NICE:-0}" "$@"; code=$?; '
    'echo "$code" >"$MONARCH_FT_EXIT.tmp" && mv -f "$MONARCH_FT_EXIT.tmp" "$MONARCH_FT_EXIT"; '
    "exit $code"
)

# A watcher's wait on a rank's ``run`` future, per look: how late it notices close().
WATCH_SLICE_S = 1.0
# Beyond a mesh's own end and stop timeouts, how long close() waits for the launcher's threads to end.
CLOSE_JOIN_SLACK_S = 5.0

_POINT = re.compile(r"\{'[^']+': (\d+)/(\d+)\}")
_KILLED = re.compile(r"Killed\(sig=(\d+)")
_EXITED = re.compile(r"exited with non-zero code (-?\d+)")


def _shell_code(code: int) -> int:
    """``$?`` of a shell: 128+N means killed by signal N."""
    return -(code - 128) if 128 < code < 128 + 65 else code


def exit_code_from_report(text: str) -> Optional[int]:
    """The exit code Monarch reports for a dead proc (its wrapper ``sh``), or None."""
    m = _KILLED.search(text)
    if m:
        return -int(m.group(1))
    m = _EXITED.search(text)
    if m:
        return _shell_code(int(m.group(1)))
    return None


# --------------------------------------------------------------------- supervision
_registry_lock = threading.Lock()
_mesh_groups: dict[str, "_Group"] = {}
_hook_installed = False


def _fault_hook(failure) -> None:
    """Replaces Monarch's default (exit the client with 1): the supervisor decides."""
    try:
        name = failure.mesh_name
        report = failure.report()
    except Exception as e:  # pragma: no cover - defensive
        log.warning("unreadable Monarch mesh failure: %s", e)
        return
    with _registry_lock:
        group = _mesh_groups.get(name)
    if group is None:
        # Monarch's own per-mesh helpers (the logger mesh) report the same death again.
        log.debug("Monarch failure on an untracked mesh %s: %s", name, report[:300])
        return
    group.on_failure(report)


def _install_hook() -> None:
    global _hook_installed
    if _hook_installed:
        return
    import monarch.actor

    monarch.actor.unhandled_fault_hook = _fault_hook
    _hook_installed = True


def _alive(pid: Optional[int]) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _rank_entry_and_spec(r: RankLaunch) -> tuple[str, str]:
    entry = r.extra.get("monarch_entry", DEFAULT_ENTRY)
    if "monarch_spec" in r.extra:
        return entry, r.extra["monarch_spec"]
    argv = list(r.argv)
    if len(argv) >= 4 and argv[1:3] == ["-m", WORKER_MODULE]:
        return entry, argv[3]
    raise ValueError(
        f"launcher=monarch runs ranks as actors calling train(spec); it cannot run argv {argv[:4]} (expected [python, -m, {WORKER_MODULE}, SPEC.json])"
    )


# --------------------------------------------------------------------- ranks
class MonarchRank(RankProcess):
    def __init__(self, group: "_Group", index: int, launch: RankLaunch, exit_path: str) -> None:
        self.group = group
        self.index = index
        self.launch = launch
        self.exit_path = exit_path
        self.proc_pid: Optional[int] = None
        self.wrapper_pid: Optional[int] = None
        self.host: str = ""
        self.local = True
        self.future = None
        self.result: Optional[tuple[str, Any]] = None  # ("ok", value) | ("actor_error", msg) | ("supervision", msg)
        self.failure_report: Optional[str] = None
        self.code: Optional[int] = None
        self.gone_since: Optional[float] = None
        self._lock = threading.Lock()

    # what the supervisor sees
    @property
    def pid(self) -> Optional[int]:
        return self.proc_pid if self.local else None

    def _watch(self) -> None:
        """Wait for the ``run`` future in slices until it settles or the launcher closes.

        Why slices: a thread blocked in Monarch's native ``get()`` with no timeout outlives the
        job (a standby's future never settles), and the interpreter's exit kills it inside native
        code, which aborts the controller after a clean job (``FATAL: exception not rethrown``,
        SIGABRT). A timed ``get()`` leaves the future readable (monarch's ``Future.get``), so the
        watcher looks again until ``close()`` sets ``closing`` and joins it."""
        from monarch.actor import ActorError

        closing = self.group.launcher.closing
        while not closing.is_set():
            try:
                value = self.future.get(timeout=WATCH_SLICE_S)
            except TimeoutError:
                continue
            except Exception as e:
                kind = "actor_error" if isinstance(e, ActorError) else "supervision"
                self.result = (kind, f"{type(e).__name__}: {e}")
                return
            self.result = ("ok", value)
            return

    def _exit_file(self) -> Optional[int]:
        try:
            with open(self.exit_path) as f:
                return _shell_code(int(f.read().strip()))
        except (OSError, ValueError):
            return None

    def poll(self) -> Optional[int]:
        with self._lock:
            if self.code is not None:
                return self.code
            code = self._verdict()
            if code is not None:
                self.code = code
                self.group.rank_done(self)
            return self.code

    def _verdict(self) -> Optional[int]:
        res = self.result
        if res is not None and res[0] == "ok":
            return 0
        if res is not None and res[0] == "actor_error":
            return 1
        code = self._exit_file()
        if code is not None:
            return code
        for text in (res[1] if res is not None else None, self.failure_report):
            if text:
                c = exit_code_from_report(text)
                if c is not None:
                    return c
        if self.group.killed:
            return -signal.SIGKILL
        if res is not None or self.failure_report is not None:
            # Monarch says it failed but not how: wait a little for the status file.
            return self._after_grace()
        if self.local and not _alive(self.proc_pid):
            return self._after_grace()
        return None

    def _after_grace(self) -> Optional[int]:
        now = time.time()
        if self.gone_since is None:
            self.gone_since = now
        return 1 if now - self.gone_since >= self.group.launcher.exit_grace_s else None

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if self.local and self.proc_pid is not None:
            try:
                os.kill(self.proc_pid, sig)
            except ProcessLookupError:
                pass
            return
        fut = self.group.actors.slice(procs=self.index).signal.call_one(int(sig))
        self.group.launcher.start_thread(lambda: _quiet_get(fut, 10.0), f"signal-{self.group.name}r{self.index}")

    def kill(self) -> None:
        self.group.kill()


def _quiet_get(fut, timeout: float) -> None:
    try:
        fut.get(timeout=timeout)
    except Exception:
        pass


# --------------------------------------------------------------------- groups
class _Group:
    """One launch attempt of one replica group: a proc mesh and its rank actors."""

    def __init__(self, launcher: "MonarchLauncher", group: int, attempt: int, standby: Optional[int] = None) -> None:
        self.launcher = launcher
        self.group = group
        self.attempt = attempt
        # A warm standby is a proc mesh of its own, named by its number (launched as group = its slot).
        self.name = f"sb{standby}" if standby is not None else f"g{group}a{attempt}"
        self.procs = None
        self.actors = None
        self.mesh_name: Optional[str] = None
        self.ranks: list[MonarchRank] = []
        self.killed = False
        self.stopped = False
        self._stop_lock = threading.Lock()

    def on_failure(self, report: str) -> None:
        m = _POINT.search(report)
        if m is None:
            for r in self.ranks:
                r.failure_report = r.failure_report or report
            return
        i = int(m.group(1))
        if 0 <= i < len(self.ranks) and self.ranks[i].failure_report is None:
            self.ranks[i].failure_report = report

    def local_pids(self) -> list[int]:
        return [p for r in self.ranks if r.local for p in (r.proc_pid, r.wrapper_pid) if p]

    def rank_done(self, rank: MonarchRank) -> None:
        """Once every rank's verdict is in, end what the mesh still runs.

        Every rank returned from train(): stop the mesh (the procs still hold torchft threads).
        Any other verdict: kill the group. A rank whose train() raised is an ``ActorError``, not
        a process exit: its proc lives on, holding the rank's gloo sockets open (a peer group's
        rank in a collective with it then waits out the whole ``ft.timeout_s`` instead of
        failing at once on the closed connection) and its TorchFT Manager heartbeating the
        Lighthouse. The controller stops only ranks still running (``Starter.stop``) and has
        every verdict here, so nobody else would (seen: survivors stalled 10 s at the second
        fault of the Monarch job test, 2026-12-06). Only once every verdict is in, so that a
        kill never becomes a peer's verdict (``records.exits.blamed_exit`` ranks signals first).
        """
        if self.killed or not self.ranks or any(r.code is None for r in self.ranks):
            return
        if all(r.code == 0 for r in self.ranks):
            self.launcher.start_thread(self._stop_when_exited, f"stop-{self.name}")
        else:
            self.launcher.start_thread(self.kill, f"stop-{self.name}")

    def _stop_when_exited(self) -> None:
        # The procs end themselves (exit_after_return_s); a ProcMesh.stop() racing with that
        # waits out Monarch's timeouts, one after it returns at once.
        if self.launcher.exit_after_return_s > 0:
            deadline = time.time() + self.launcher.exit_after_return_s + 5.0
            while time.time() < deadline and any(_alive(p) for p in self.local_pids()):
                time.sleep(0.1)
        self.stop()

    def kill(self) -> None:
        with self._stop_lock:
            if not self.killed:
                self.killed = True
                for pid in self.local_pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.stop()

    def stop(self) -> None:
        with self._stop_lock:
            if self.stopped:
                return
            self.stopped = True
            t0 = time.time()
            if self.procs is not None:
                try:
                    self.procs.stop(f"monarch_ft: group {self.group} attempt {self.attempt} done").get(timeout=self.launcher.stop_timeout_s)
                except Exception as e:
                    log.warning("stopping proc mesh %s: %s", self.name, e)
            left = [p for p in self.local_pids() if _alive(p)]
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            procs = []
            for pid in left:
                try:
                    procs.append(psutil.Process(pid))
                except psutil.Error:
                    pass
            psutil.wait_procs(procs, timeout=5.0)
            with _registry_lock:
                if self.mesh_name:
                    _mesh_groups.pop(self.mesh_name, None)
            log.info("group %s stopped in %.2fs (%d processes needed SIGKILL after ProcMesh.stop())", self.name, time.time() - t0, len(procs))


# --------------------------------------------------------------------- launcher
class MonarchLauncher(Launcher):
    name = "monarch"
    # Its proc meshes belong to the process that spawned them (not adoptable), Monarch starts
    # the procs (no warm fork), a standby holds a proc mesh of its own (none by default), and
    # an actor trains in a worker thread of its proc.
    traits = LauncherTraits(ranks_on_this_machine=True, worker_thread_trainer="a Monarch actor")

    @classmethod
    def traits_for(cls, options: Optional[Options]) -> LauncherTraits:
        # allocator=slurm places each group's procs on the nodes of its own Slurm job.
        return dataclasses.replace(cls.traits, ranks_on_this_machine=options is None or options.allocator == "local")

    @classmethod
    def adoption_problem(cls) -> Optional[str]:
        # What it can and cannot reattach: nothing. A proc mesh and its actors belong to the
        # process that spawned them (only it can call or supervise them), so a new controller
        # has no ranks it can take over; their lease ends them with a checkpoint.
        return (
            "launcher=monarch cannot take over a running job (controller.attach=true): its proc meshes belong to the controller "
            "process that made them; resume from the job's checkpoints instead (checkpoint.resume=true in a new run)"
        )

    def __init__(self, run_dir: str, options: Options) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.options = options
        self.allocator = options.allocator
        self.spawn_timeout_s = options.spawn_timeout_s
        self.stop_timeout_s = options.stop_timeout_s
        self.exit_grace_s = options.exit_grace_s
        self.exit_after_return_s = options.exit_after_return_s
        self.slurm_options = options.slurm
        self.groups: dict[int, _Group] = {}
        self.all_groups: list[_Group] = []
        self._host_meshes: dict[int, Any] = {}
        self._slurm_jobs: dict[int, Any] = {}
        self._slurm_hosts: dict[int, list[str]] = {}
        self._retired_jobs: list[Any] = []  # allocations of groups a promoted standby replaced
        self._status_dir = os.path.join(self.run_dir, "monarch")
        os.makedirs(self._status_dir, exist_ok=True)
        # Set by close(): the watchers stop looking, and close() joins every thread started here.
        self.closing = threading.Event()
        self._threads: list[threading.Thread] = []
        os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", options.supervision_poll)
        _install_hook()

    # ------------------------------------------------------------ hosts
    def _host_mesh(self, group: int):
        if self.allocator == "local":
            from monarch.actor import this_host

            return this_host()
        if group not in self._host_meshes:
            self._allocate_slurm(group)
        return self._host_meshes[group]

    def _allocate_slurm(self, group: int) -> None:
        if shutil.which("sbatch") is None or shutil.which("squeue") is None:
            raise RuntimeError("launcher=monarch allocator=slurm needs Slurm's sbatch and squeue on PATH")
        from monarch.job import SlurmJob

        mesh = f"group{group}"
        job = SlurmJob(
            meshes={mesh: self.slurm_options.nodes_per_group},
            python_exe=sys.executable,
            log_dir=os.path.join(self.run_dir, "logs"),
            **self.slurm_options.job_kwargs(group),
        )
        job.apply()
        state = job.state(cached_path=None)
        self._slurm_jobs[group] = job
        self._host_meshes[group] = getattr(state, mesh)
        self._slurm_hosts[group] = list(getattr(job, "_all_hostnames", []) or [])

    def group_host(self, group: int) -> str:
        if self.allocator == "local":
            return "127.0.0.1"
        self._host_mesh(group)
        hosts = self._slurm_hosts.get(group) or []
        return socket.gethostbyname(hosts[0]) if hosts else socket.gethostbyname(socket.gethostname())

    def control_host(self) -> str:
        if self.allocator == "local":
            return "127.0.0.1"
        return socket.gethostbyname(socket.gethostname())

    def describe(self) -> dict:
        if self.allocator == "local":
            return {"launcher": self.name, "allocator": "local", "hosts": "localhost"}
        return {"launcher": self.name, "allocator": self.allocator, "hosts": {str(g): h for g, h in self._slurm_hosts.items()}}

    # ------------------------------------------------------------ launch
    def _bootstrap(self, ranks: list[RankLaunch], exits: list[str]):
        from monarch._rust_bindings.monarch_hyperactor.host_mesh import BootstrapCommand
        from monarch._src.actor.host_mesh import default_bootstrap_cmd

        base = default_bootstrap_cmd()
        base_env = {k: v for k, v in base.env.items() if v is not None}

        def per_rank(point) -> "BootstrapCommand":
            i = point.rank % len(ranks)
            r = ranks[i]
            env = {**r.env, **base_env, "MONARCH_FT_CWD": r.cwd, "MONARCH_FT_LOG": r.log_path, "MONARCH_FT_EXIT": exits[i], "MONARCH_FT_NICE": str(r.niceness)}
            return BootstrapCommand("/bin/sh", None, ["-c", _WRAPPER, base.program, *base.args], env, False)

        return per_rank

    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        if not ranks:
            return []
        g, attempt = ranks[0].group, ranks[0].attempt
        group = _Group(self, g, attempt, ranks[0].standby)
        exits = []
        for r in ranks:
            os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
            path = os.path.join(self._status_dir, f"g{g}r{r.rank}.a{attempt}.exit")
            for p in (path, path + ".tmp"):
                if os.path.exists(p):
                    os.remove(p)
            exits.append(path)
        entries = [_rank_entry_and_spec(r) for r in ranks]
        group.ranks = [MonarchRank(group, i, r, exits[i]) for i, r in enumerate(ranks)]
        # A warm standby's mesh too is spawned here, synchronously, so its spawn stalls the
        # supervisor's loop as a cold relaunch does (3-10 s measured on 2 cores at load 20-40).
        # Spawning it from a thread of its own was tried once and failed there ("error creating
        # proc ... on host mesh agent", then spawn timeouts, at load 40): not investigated.
        try:
            module, _, name = RANK_ACTOR.partition(":")
            RankActor = getattr(importlib.import_module(module), name)  # the rank side, by its module path
            host = self._host_mesh(g)
            group.procs = host.spawn_procs(per_host={"procs": len(ranks)}, name=group.name, bootstrap_command=self._bootstrap(ranks, exits))
            group.actors = group.procs.spawn("rank", RankActor)
            group.mesh_name = group.actors._name.get(timeout=self.spawn_timeout_s)
            with _registry_lock:
                _mesh_groups[group.mesh_name] = group
            infos = group.actors.info.call().get(timeout=self.spawn_timeout_s)
            here = socket.gethostname()
            for point, info in infos.items():
                rank = group.ranks[point.rank]
                rank.proc_pid, rank.wrapper_pid, rank.host = info["pid"], info["ppid"], info["host"]
                rank.local = self.allocator == "local" or info["host"] == here
            for i, rank in enumerate(group.ranks):
                entry, spec = entries[i]
                rank.future = group.actors.slice(procs=i).run.call_one(spec, entry, self.exit_after_return_s)
                self.start_thread(rank._watch, f"watch-g{g}r{i}")
        except BaseException:
            group.kill()
            raise
        old = self.groups.get(g)
        if old is not None and not old.stopped:
            old.kill()
        self.groups[g] = group
        self.all_groups.append(group)
        return list(group.ranks)

    def place_group(self, group: int, slot: int) -> None:
        """A promoted standby's proc mesh (launched as group ``slot``) now serves ``group``: a
        cold relaunch of ``group`` replaces (kills) it, and with ``allocator=slurm`` the
        group's hosts are the standby's allocation (the old one is released at close)."""
        mesh = self.groups.pop(slot, None)
        if mesh is not None:
            self.groups[group] = mesh
        if slot in self._host_meshes:
            if group in self._slurm_jobs:
                self._retired_jobs.append(self._slurm_jobs.pop(group))
            for held in (self._host_meshes, self._slurm_jobs, self._slurm_hosts):
                if slot in held:
                    held[group] = held.pop(slot)

    def start_thread(self, target, name: str) -> None:
        """Run ``target`` in a daemon thread that close() joins.

        Args:
            target: what the thread runs; it must end once ``closing`` is set (or on its own
                within the mesh stop timeout).
            name: the thread's name, seen in a stack dump."""
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def _join_threads(self) -> None:
        # No thread of ours may be inside Monarch's native code when the interpreter exits:
        # finalization kills it there and the process aborts after a clean job.
        self.closing.set()
        deadline = time.time() + self.exit_after_return_s + self.stop_timeout_s + CLOSE_JOIN_SLACK_S
        for t in list(self._threads):
            t.join(timeout=max(0.0, deadline - time.time()))
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            log.warning("launcher=monarch: threads still waiting on Monarch at close: %s", ", ".join(left))

    def close(self) -> None:
        for group in self.all_groups:
            if group.stopped:
                with group._stop_lock:  # a background stop of a finished group may be in flight
                    pass
            elif not group.killed and group.ranks and all(r.code == 0 for r in group.ranks):
                group._stop_when_exited()  # finished ranks end themselves: no SIGKILL
            else:
                group.kill()
        for job in [*self._slurm_jobs.values(), *self._retired_jobs]:
            try:
                job.kill()
            except Exception as e:
                log.warning("releasing the Slurm allocation: %s", e)
        self._slurm_jobs.clear()
        self._retired_jobs.clear()
        self._join_threads()


LAUNCHER = MonarchLauncher


def build(cfg, run_dir: str) -> MonarchLauncher:
    options = Options.parse(cfg.options, cfg.name)
    try:
        import monarch.actor  # noqa: F401
    except ImportError as e:
        raise ValueError(f"launcher=monarch needs torchmonarch (pip install torchmonarch==0.7.0): {e}") from None
    return MonarchLauncher(run_dir, options)
