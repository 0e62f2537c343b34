"""The launcher interface: how the supervisor turns rank specs into running ranks.

The supervisor only ever sees :class:`RankProcess` handles (poll, signal, pid), so a
Slurm launcher (a job of M tasks per group) or a Monarch launcher (a proc mesh per
group) plugs in by implementing :class:`Launcher` without touching the supervisor.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, ClassVar, Optional

from monarch_ft.common.process import ProcessIdentity
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.exits import LOST_EXIT
from monarch_ft.records.reports import report_finished


@dataclass
class RankLaunch:
    group: int
    rank: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    log_path: str
    cwd: str
    # Logical host the rank is placed on (a simulated host on one machine).
    host: str = "localhost"
    extra: dict = field(default_factory=dict)
    # Dies with the controller that launched it (a waiting warm standby: monarch_ft.controller.standby_pool);
    # training ranks outlive their controller (monarch_ft.controller). Each launcher does it
    # its own way: local, PR_SET_PDEATHSIG; monarch, its mesh is stopped when the launcher
    # closes; slurm, its job is cancelled then, and its task wrapper kills the rank when a
    # controller on its node dies. Where none of that reaches (a SIGKILLed controller's
    # Monarch procs were seen to live on; a Slurm node of its own), a waiting standby gives
    # up once the controller's heartbeat goes stale or names another controller
    # (rank.standby_wait.ControllerWatch): a standby nobody can promote holds no allocation.
    die_with_controller: bool = False
    # CPU niceness of the rank's process (0: the training ranks'). A warm standby runs at
    # controller.standby_pool.STANDBY_NICENESS so that its build yields the cores to training; each launcher
    # applies it its own way (a child's setpriority, the Slurm task wrapper, the Monarch
    # proc's bootstrap shell), never as an argv prefix, so argv stays the rank's own command.
    niceness: int = 0
    # The warm standby this rank belongs to (None: a replica group's rank). Its ``group`` is
    # then the standby's host/device slot; launchers name its job/mesh by the standby and
    # do not block on its start (a standby waiting for resources must not hold up the job).
    standby: Optional[int] = None


@dataclass
class ForkHost:
    """Where a fork server for a group's ranks runs (monarch_ft.controller.fork_pool): the host the
    launcher would start the group's ranks on, and how it puts a process there."""

    # One fork server per key (the host: "localhost", or a simulated host's namespace).
    key: str
    # argv prefix and preexec that start a process on the host (``ip netns exec <ns>``).
    argv_prefix: list[str]
    preexec: Optional[Callable[[], None]]
    # Env the launcher adds for a rank on that host (setdefault), and the name it records.
    rank_env: dict[str, str] = field(default_factory=dict)
    host: str = "localhost"
    # A simulated host's network namespace (launcher=local_hosts): every host is on this one
    # machine, so a server of another host can fork a process for this one, which enters the
    # namespace after the fork (monarch_ft.launcher.hosts.enter_host). None: only this host's
    # own server forks for it.
    netns: Optional[str] = None


class Capability(str, Enum):
    """What a launcher can do to a group's host beyond signalling its ranks."""

    PARTITION = "partition"  # take the host's link down for a while
    SLOW_LINK = "slow_link"  # rate-limit (or delay) the host's link for a while
    NODE_DOWN = "node_down"  # the group's whole node fails, as its scheduler sees it, and returns later


@dataclass
class LauncherOptions:
    """Base of each launcher's own options (``launcher.options``), one dataclass per launcher.

    Each is registered in Hydra's ``launcher`` group (``<name>_schema``), so an unknown option
    or a wrong type fails in Hydra before anything runs; :meth:`check` judges the values a
    type cannot, and ``config.validate`` calls it on the controller before anything is
    launched. :meth:`parse` also takes a plain dict, for launchers built in code.
    """

    def check(self, launcher: str) -> None:
        """Raise ``ConfigError`` (one line naming the option and the fix) for a value that cannot run."""

    @classmethod
    def parse(cls, value: Any, launcher: str) -> "LauncherOptions":
        """``value`` (this dataclass, a dict or None) as this dataclass, checked."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        if isinstance(value, LauncherOptions) and not isinstance(value, cls):
            other = type(value).__module__.rsplit(".", 1)[-1]
            raise ConfigError(f"launcher.name={launcher} with launcher={other}'s options: select the launcher with launcher={launcher}, not launcher.name")
        # A dataclass carries extra keys when Hydra appended them (+launcher.options.x=...).
        given = vars(value) if isinstance(value, cls) else dict(value or {})
        known = sorted(f.name for f in dataclasses.fields(cls))
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigError(f"launcher={launcher}: unknown option(s) {', '.join(unknown)}: known are {', '.join(known)}")
        if isinstance(value, cls):
            options = value
        else:
            try:
                options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), given))
            except OmegaConfBaseException as e:
                key = getattr(e, "full_key", None)
                raise ConfigError(f"launcher.options{'.' + key if key else ''}: {str(e).splitlines()[0]}") from None
        options.check(launcher)
        return options


class RankProcess(ABC):
    """One running rank, wherever it runs."""

    launch: RankLaunch
    # Forked from a fork server (monarch_ft.controller.fork_pool.ForkedProcess), not started by the launcher.
    forked: bool = False

    @property
    @abstractmethod
    def pid(self) -> Optional[int]:
        """OS pid when the rank runs on this machine (for psutil), else None."""

    @abstractmethod
    def poll(self) -> Optional[int]:
        """None while running; else the exit code, negative for a signal (as subprocess)."""

    @abstractmethod
    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> Optional[int]:
        """Wait up to ``timeout`` seconds for the exit code (polls; launchers may do better)."""
        deadline = time.time() + timeout
        while True:
            code = self.poll()
            if code is not None or time.time() >= deadline:
                return code
            time.sleep(0.05)


class AdoptedProcess(RankProcess):
    """A rank a previous controller launched: watched by pid and start time.

    It is not this process's child, so there is no exit status to read: a rank that is
    gone is taken to have exited 0 if its report says it finished, else :data:`LOST_EXIT`.
    """

    def __init__(self, launch: RankLaunch, identity: ProcessIdentity, report_path: str) -> None:
        self.launch = launch
        self.identity = identity
        self.report_path = report_path
        self._code: Optional[int] = None

    @property
    def pid(self) -> Optional[int]:
        return self.identity.pid

    def poll(self) -> Optional[int]:
        if self._code is None and not self.identity.alive():
            self._code = 0 if report_finished(self.report_path) else LOST_EXIT
        return self._code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.identity.pid, sig)
            except ProcessLookupError:
                pass


@dataclass(frozen=True)
class LauncherTraits:
    """What a launcher can do, declared on its class (:attr:`Launcher.traits`).

    Config validation, the standby pool and chaos drills read these instead of the
    launcher's name, and without building it: building a launcher acts (a Monarch one
    creates ``./monarch`` and installs a process-wide hook, a Slurm one asks the cluster).
    A trait that depends on the launcher's options comes from :meth:`Launcher.traits_for`.
    """

    # A new controller (controller.attach=true) can take over the ranks a previous one
    # launched; a controller can detach and leave them training.
    adoptable: bool = False
    # Relaunches can be forked from a warm fork server on the group's host (ft.warm_fork):
    # the launcher starts the ranks itself, not through an engine.
    forkable: bool = False
    # Each group on its own simulated host (a network namespace, monarch_ft.launcher.hosts): its
    # interfaces are the host's (eth0, lo), and network faults (partition, slow_link) can
    # act on its link.
    simulated_hosts: bool = False
    # Every rank runs on this machine: its cores, devices and interfaces are the ranks'
    # (checked before launch; ranks elsewhere check them at start).
    ranks_on_this_machine: bool = False
    # ft.standby_groups when unset: 1 where a standby costs only local processes, 0 where
    # it holds a real allocation (K > 0 is then the user's explicit choice).
    default_standby_groups: int = 0
    # A group's whole node can be made to fail as a machine does, seen by the scheduler too,
    # and come back (launcher=slurm on a local cluster of simulated nodes,
    # monarch_ft.testing.slurm_cluster --nodes N): chaos node_down needs it.
    node_faults: bool = False
    # Set where a rank trains in a worker thread, naming what runs it ("a Monarch actor"):
    # Python runs signal handlers on the main thread only, so such a rank cannot answer a
    # signal with its own handler. None: the trainer runs on the main thread.
    worker_thread_trainer: Optional[str] = None


class Launcher(ABC):
    name: str = "base"
    # What this launcher can do (see LauncherTraits): class-level, read without building it.
    traits: ClassVar[LauncherTraits] = LauncherTraits()

    @classmethod
    def traits_for(cls, options: Optional[LauncherOptions]) -> LauncherTraits:
        """The traits of this launcher run with ``options`` (its own :class:`LauncherOptions`).

        Args:
            options: the parsed ``launcher.options``; a launcher whose traits depend on them
                (local's ``simulated_hosts``) overrides this; the others return :attr:`traits`.
        """
        return cls.traits

    @classmethod
    def adoption_problem(cls) -> Optional[str]:
        """Why this launcher cannot take over the ranks a previous controller launched
        (``controller.attach=true``), as one line naming the way out; None where it can
        (``traits.adoptable``). A class method: config validation asks before building one."""
        if cls.traits.adoptable:
            return None
        return f"launcher={cls.name} cannot take over a running job (controller.attach=true): its ranks cannot be re-adopted"

    def group_host(self, group: int) -> str:
        """Address the ranks of ``group`` bind and advertise (their TCPStore, Manager, transport)."""
        return "127.0.0.1"

    def place_group(self, group: int, slot: int) -> None:
        """A promoted warm standby, launched on host/device ``slot``, now serves ``group``:
        from now on the group's host (its address, a network fault on it) is that slot's."""

    def control_host(self) -> str:
        """Address on which supervisor-side services (the Lighthouse) must listen to be reachable."""
        return "127.0.0.1"

    @property
    def capabilities(self) -> set:
        """Faults this launcher can do to a group's host (:class:`Capability`)."""
        return set()

    def describe(self) -> dict:
        """Launcher and host layout, for the event log and reports."""
        return {"launcher": self.name, "hosts": "localhost"}

    # The nodes of a cluster (Slurm): where each job went, the scheduler's view of each node,
    # and the nodes new jobs are kept off. A launcher of one machine has none of these.
    def take_placements(self) -> list[dict]:
        """Groups' and standbys' allocations that started since the last call, each once:
        ``group`` (None for a standby), ``standby``, ``attempt``, ``job_id``, ``node``,
        ``nodes``, ``allocation_s`` (submission to its first rank running)."""
        return []

    def node_states(self) -> dict[str, str]:
        """Every node's state as the scheduler sees it (its own words), read at most as
        often as the launcher allows; {} where there is no scheduler."""
        return {}

    def node_health(self, state: str):
        """What a state of :meth:`node_states` says of the node (records.events.NodeHealth)."""
        raise NotImplementedError(f"launcher={self.name} has no nodes")

    def exclude_nodes(self, nodes: set[str]) -> None:
        """Keep every allocation made from now on off ``nodes`` (suspects of a node fault)."""

    def pending_allocations(self) -> dict[str, tuple[str, ...]]:
        """Allocations submitted and still waiting for a node, that a change of the exclusions
        concerns: job id -> the nodes each was told to keep off. {} where there is no scheduler."""
        return {}

    def replan_pending(self, job_id: str, exclude: set[str]) -> bool:
        """Give a waiting allocation the nodes to keep off now, through the scheduler's own
        command; False when the scheduler refused (the job started meanwhile, or ended)."""
        return False

    @abstractmethod
    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        """Start every rank of one replica group (all or none)."""

    def fork_host(self, group: int) -> Optional[ForkHost]:
        """Where ``group``'s relaunched ranks can be forked from a warm fork server
        (monarch_ft.controller.fork_pool, ``ft.warm_fork``); None where an engine starts the ranks
        (Slurm, Monarch): their relaunches start cold. A launcher that returns one declares
        ``traits.forkable``."""
        return None

    def handles(self) -> dict:
        """What a new controller needs, beyond each rank's pid and start time, to re-adopt
        this launcher's ranks (e.g. Slurm job ids): saved in ``controller.json`` on every
        change, so keep it small and JSON-able. None needed: {}."""
        return {}

    def restore_handles(self, handles: dict) -> None:
        """A new controller (controller.attach) gives back what :meth:`handles` returned
        in the previous one, before it calls :meth:`adopt` for each recorded rank."""

    def adopt(self, launch: RankLaunch, identity, report_path: str) -> RankProcess:
        """A rank a previous controller launched, to watch from now on (controller.attach).

        Args:
            launch: the rank's recorded launch.
            identity: its :class:`~monarch_ft.common.process.ProcessIdentity` (pid and start time).
            report_path: its report file (an adopted rank's exit status is read from it).
        """
        raise NotImplementedError(self.adoption_problem())

    def close(self) -> None:
        """Release whatever the launcher holds (allocations, connections)."""


def restore_later(seconds: float, restore: Callable[[], Optional[dict]], on_restore: Optional[Callable[[dict], None]]) -> threading.Timer:
    """A daemon timer, not yet started, that ends a timed fault (a link or a node brought back)
    after ``seconds`` and hands what ``restore`` returns to ``on_restore``. The caller records it
    (so an early restore can cancel it) before it starts it.

    Args:
        seconds: how long the fault lasts.
        restore: brings it back now; returns what was done, or None when it was already back.
        on_restore: told of the restore (the event log); an error there is dropped, since the
            job may have ended and closed its log before the timer fired.
    """

    def fire() -> None:
        info = restore()
        if info is not None and on_restore is not None:
            try:
                on_restore(info)
            except Exception:
                pass  # e.g. the event log already closed at the end of the job

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    return timer
