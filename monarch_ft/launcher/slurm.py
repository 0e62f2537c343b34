"""Ranks as Slurm tasks: each replica group is one Slurm batch job of M tasks.

``launch_group`` writes a manifest (each rank's argv, env, cwd, log) and an sbatch script
whose single ``srun`` step starts M tasks of a tiny wrapper (``python -m
monarch_ft.launcher._slurm_task MANIFEST``, :mod:`monarch_ft.launcher._slurm_task`). Task ``SLURM_PROCID`` = rank: the wrapper
runs that rank's argv as its child, writes ``<log>.pid`` (node, host, pids) once it runs
and ``<log>.exit`` (the child's exit code, negative for a signal, as subprocess) when it
ends. So a rank's exit code or signal is exact, per rank, without sacct/slurmdbd.

``poll()`` reads the ``.exit`` file; while there is none it looks at the wrapper's pid when
the task runs on this machine, else at the job state from ``squeue``, which is run at
most once per ``poll_interval_s`` for all jobs (the supervisor polls every rank at 20 Hz).
A job that ended without a rank's exit record (cancelled before it ran, node failure)
gives a non-zero code from ``scontrol show job`` (``ExitCode=N:SIG``, else by its state).

``send_signal`` signals the rank's own process when it runs on this machine (its pid is
known from the ``.pid`` file, e.g. for chaos and psutil), else ``scancel --signal=SIG
--full JOB`` (the whole group: Slurm signals steps, not single tasks). ``kill()`` SIGKILLs
the rank and ``scancel``\\ s the job once none of its ranks is left; the supervisor then
submits a new job for the relaunched group.

"This machine" is the pid space (:func:`~monarch_ft.common.process.pid_space`: the kernel and
the pid namespace), not the host name: a task on a simulated node (a network namespace
with a host name of its own) is watched by pid as a local one is. A task that vanished
without recording its exit (its wrapper gone with it) while Slurm still counts its job
running, or whose node Slurm reports not responding, is lost with its node
(:data:`~monarch_ft.records.exits.LOST_EXIT`): the supervisor does not wait for Slurm to fail
the job.

Unpinned (``nodes`` unset), each group's job, and each standby's, goes wherever Slurm puts
it: its ranks bind and advertise the address their node reaches the Lighthouse from (the
rule of ``ft.transport_interface``, applied on the node), and the Lighthouse listens on the
address this machine reaches the nodes from. The supervisor learns the node when the job
runs (:meth:`SlurmLauncher.take_placements`), can keep new jobs off suspect nodes
(:meth:`SlurmLauncher.exclude_nodes`: ``sbatch --exclude``), and reads Slurm's own view
of every node (:meth:`SlurmLauncher.node_states`). On a local cluster of simulated nodes
(:mod:`monarch_ft.launcher.slurm_nodes`) it can also take a group's node down as a machine
fails (:meth:`SlurmLauncher.node_down`).

Options (``launcher.options.*``): see :class:`Options`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from monarch_ft.paths import REPO_ROOT
from monarch_ft.common.net import route_to
from monarch_ft.common.process import pid_space, start_ticks
from monarch_ft.launcher.base import AdoptedProcess, Capability, Launcher, LauncherOptions, LauncherTraits, RankLaunch, RankProcess, restore_later
from monarch_ft.launcher.slurm_nodes import bring_up, read_record, take_down
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import NodeHealth
from monarch_ft.records.exits import LOST_EXIT
from monarch_ft.records.layout import RunLayout


@dataclass
class Options(LauncherOptions):
    """``launcher=slurm``: every replica group one batch job of ``ft.ranks_per_group`` tasks."""

    partition: Optional[str] = None
    """Slurm partition for every group's job; null: the cluster's default partition."""

    slurm_conf: Optional[str] = None
    """slurm.conf of the cluster; null: ``$SLURM_CONF``, else Slurm's built-in default."""

    sbatch_args: List[str] = field(default_factory=list)
    """Extra sbatch arguments, e.g. ``["--time=01:00:00", "--account=ml"]``."""

    poll_interval_s: float = 0.5
    """Seconds between two runs of squeue (one for all jobs at once): how soon a job's end is seen."""

    cpus_per_task: int = 1
    """Cores Slurm allots each rank (``sbatch --cpus-per-task``)."""

    start_timeout_s: float = 30.0
    """Seconds a group's launch waits for its job to start and every rank to report its pid (then
    it returns anyway: a job still pending is watched by the controller's ``ft.startup_timeout_s``)."""

    job_name: str = "monarch_ft"
    """Prefix of every job's name (``<job_name>-g<group>a<attempt>``)."""

    nodes: Optional[List[str]] = None
    """Pin group g to nodes[g % len(nodes)] (sbatch --nodelist); its ranks then bind that
    node's address. None: each group's job (and each standby's) goes wherever Slurm puts it,
    one node per job, and its ranks bind the address their node reaches the Lighthouse from
    (the rule of ft.transport_interface); suspect nodes are kept out (sbatch --exclude)."""

    node_poll_interval_s: float = 1.0
    """sinfo (every node's state as Slurm sees it) is run at most this often: how soon the
    controller sees Slurm mark a node not responding, down or back (node_state events), and
    the resolution of Slurm's own detection time in drill reports."""

    def check(self, launcher: str) -> None:
        if self.poll_interval_s <= 0:
            raise ConfigError(f"launcher.options.poll_interval_s={self.poll_interval_s}: must be > 0")
        if self.start_timeout_s < 0:
            raise ConfigError(f"launcher.options.start_timeout_s={self.start_timeout_s}: must be >= 0")
        if self.cpus_per_task < 1:
            raise ConfigError(f"launcher.options.cpus_per_task={self.cpus_per_task}: must be >= 1")
        if self.nodes is not None and not self.nodes:
            raise ConfigError("launcher.options.nodes=[]: name at least one node, or null for any node")
        if self.node_poll_interval_s <= 0:
            raise ConfigError(f"launcher.options.node_poll_interval_s={self.node_poll_interval_s}: must be > 0")


FINAL_STATES = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
    "SPECIAL_EXIT",
}
# Exit code for a rank whose job ended without the rank recording one, by job state.
_STATE_CODES = {
    "CANCELLED": -signal.SIGTERM,
    "TIMEOUT": -signal.SIGTERM,
    "PREEMPTED": -signal.SIGTERM,
    "DEADLINE": -signal.SIGTERM,
    "NODE_FAIL": LOST_EXIT,  # lost with its node
    "OUT_OF_MEMORY": -signal.SIGKILL,
    "BOOT_FAIL": 1,
    "FAILED": 1,
    "COMPLETED": 1,  # the wrapper itself failed: see the job's slurm-*.out
}
_HOSTNAME = socket.gethostname()
_PID_SPACE = pid_space()
# Slurm node states (sinfo %T) by what they say of the node: Slurm took it out (failed, or an
# admin did), or it takes no new job; anything else runs jobs. A "*" suffix: not responding.
_DOWN_STATES = ("down", "fail", "failing")
_OUT_STATES = ("drained", "draining", "drain", "future", "unknown", "maint", "reboot", "reboot_issued", "reboot_requested", "power_down", "powered_down")


def node_health(state: str) -> NodeHealth:
    """What Slurm's state of a node (``sinfo %T``: ``idle``, ``allocated*``, ``down*``,
    ``drained``...) says of it: down (or failing), taken out, not responding (a ``*``
    suffix on any other state), else up."""
    state = state.strip().lower()
    base = state.rstrip("*~#!%$@^-").split("+")[0]
    if base in _DOWN_STATES:
        return NodeHealth.DOWN
    if base in _OUT_STATES:
        return NodeHealth.OUT
    if state.endswith("*"):
        return NodeHealth.NOT_RESPONDING
    return NodeHealth.UP


# The wrapper each Slurm task runs its rank under (by module path: it runs with -S, no site-packages).
TASK_MODULE = "monarch_ft.launcher._slurm_task"
# launch_group stops waiting for a job Slurm keeps pending this long (seconds, a few of the
# scheduler's passes: a job that can run starts within about one, a job that waits for a
# node waits for minutes).
PENDING_WAIT_S = 5.0


class SlurmError(ConfigError):
    """A Slurm problem the user can fix; one line (the CLI prints it and exits 2)."""


def _local_names() -> set[str]:
    names = {_HOSTNAME, _HOSTNAME.split(".")[0], "localhost", "127.0.0.1"}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


def _short(text: str, n: int = 300) -> str:
    return " ".join((text or "").split())[:n]


class _Job:
    """One sbatch job = one attempt of one replica group."""

    def __init__(self, job_id: str, group: int, attempt: int, submitted: float, standby: Optional[int] = None) -> None:
        self.job_id = job_id
        self.group = group
        self.attempt = attempt
        self.submitted = submitted
        self.standby = standby
        self.placed = False  # reported by take_placements
        self.ranks: list["SlurmRank"] = []
        self.state: Optional[str] = "PENDING"
        self.reason = "None"  # why it is pending (squeue %r): "None" until Slurm has looked at it
        self.node: Optional[str] = None
        self.final_seen: Optional[float] = None
        self.exit_info: Optional[tuple[str, int, int]] = None  # (state, code, signal) from scontrol
        self.cancelled = False
        self.lost = False  # a task of it vanished while Slurm counted it running (its node failed)
        # The nodes it was told to keep off (sbatch --exclude, or scontrol update since); None for
        # a job pinned to a node (--nodelist), which exclusions do not concern.
        self.excluded: Optional[tuple[str, ...]] = None

    @property
    def final(self) -> bool:
        return self.state is None or self.state in FINAL_STATES


class SlurmRank(RankProcess):
    def __init__(self, launch: RankLaunch, job: _Job, launcher: "SlurmLauncher") -> None:
        self.launch = launch
        self.job = job
        self.launcher = launcher
        self._info: Optional[dict] = None
        self._code: Optional[int] = None
        self._killed = False

    # ------------------------------------------------------------ files
    @property
    def exit_path(self) -> str:
        return self.launch.log_path + ".exit"

    @property
    def pid_path(self) -> str:
        return self.launch.log_path + ".pid"

    def info(self) -> Optional[dict]:
        """What the wrapper wrote once the task ran: node, host, pid, wrapper_pid, job_id."""
        if self._info is None:
            try:
                with open(self.pid_path) as f:
                    self._info = json.load(f)
            except (OSError, ValueError):
                return None
            if self._info.get("node"):
                self.launch.host = self._info["node"]
        return self._info

    def _read_exit(self) -> Optional[int]:
        try:
            with open(self.exit_path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _local(self) -> bool:
        """The task runs in this process's pid space (this machine, or a simulated node on it):
        its pids can be watched and signalled. A record without one (an older job's): by host name."""
        info = self.info()
        if not info:
            return False
        if info.get("pid_space") and _PID_SPACE:
            return info["pid_space"] == _PID_SPACE
        return info.get("host") == _HOSTNAME

    def _wrapper_alive(self) -> bool:
        info = self.info() or {}
        if "wrapper_pid" not in info or start_ticks(info["wrapper_pid"]) != info.get("wrapper_start"):
            return False
        try:
            with open(f"/proc/{info['wrapper_pid']}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    # ------------------------------------------------------------ RankProcess
    @property
    def pid(self) -> Optional[int]:
        """The rank's own process when its task runs on this machine (psutil, chaos)."""
        return self.info()["pid"] if self._local() else None

    @property
    def node(self) -> Optional[str]:
        info = self.info()
        return info.get("node") if info else self.job.node

    def poll(self) -> Optional[int]:
        if self._code is not None:
            return self._code
        code = self._read_exit()
        if code is None:
            if self._local():
                if self._wrapper_alive():
                    return None
                code = self._read_exit()
                if code is None:  # the wrapper was killed (SIGKILL) before recording
                    code = self._vanished_code()
            else:
                self.launcher._refresh()
                if not self.job.final:
                    if not (self.job.lost or self.launcher.node_lost(self.node)):
                        return None
                    self.launcher._lose(self.job)  # its node stopped answering Slurm: it went with it
                    self._code = LOST_EXIT
                    return LOST_EXIT
                code = self._read_exit()
                if code is None:
                    # The job ended: give a remote wrapper's .exit file a moment to appear.
                    if self.info() is not None and time.time() - (self.job.final_seen or 0) < 2.0:
                        return None
                    code = self._fallback_code()
        self._code = code
        return code

    def _vanished_code(self) -> int:
        """A local task gone without recording how its rank ended: killed by us or with its
        job (Slurm's own stop, by the job's state); else, while Slurm still counts the job
        running, everything of the task vanished at once, as with a node that failed: lost."""
        if self._killed:
            return -signal.SIGKILL
        if self.job.lost:
            return LOST_EXIT
        if not self.job.cancelled:
            self.launcher._refresh(force=True)
            if not self.job.final:
                self.launcher._lose(self.job)
                return LOST_EXIT
        return self._fallback_code()

    def _fallback_code(self) -> int:
        if self._killed:
            return -signal.SIGKILL
        state, code, sig = self.launcher._exit_info(self.job)
        if sig:
            return -sig
        if code:
            return code
        return _STATE_CODES.get(state, -signal.SIGKILL if self.job.cancelled else 1)

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if self._local():
            try:
                os.kill(self.info()["pid"], sig)
            except ProcessLookupError:
                pass
            return
        self.launcher._signal_job(self.job, sig)

    def kill(self) -> None:
        if self.poll() is None:
            self._killed = True
            if self._local():
                try:
                    os.kill(self.info()["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                self.launcher._cancel(self.job, kill=True)
        self.launcher._release_if_done(self.job)


class SlurmLauncher(Launcher):
    name = "slurm"
    # Slurm jobs never depended on the supervisor's process (the task wrapper ends a rank
    # with its controller only for a waiting standby): a new controller re-adopts each job
    # by its id, saved in controller.json (handles), and watches and signals its ranks as
    # the launching controller did (squeue/scontrol by id, .pid/.exit files, scancel --signal).
    # Its ranks run on the cluster's nodes, started by Slurm (no warm fork), and a standby
    # holds a job of its own (none by default).
    traits = LauncherTraits(adoptable=True)

    @classmethod
    def traits_for(cls, options: Optional[Options]) -> LauncherTraits:
        """A cluster of simulated nodes (its record beside its slurm.conf) can lose a node."""
        conf = (options.slurm_conf if options else None) or os.environ.get("SLURM_CONF")
        return dataclasses.replace(cls.traits, node_faults=bool(read_record(conf)))

    # ------------------------------------------------------------ controller.attach
    def handles(self) -> dict:
        """Every job not known to have ended: its id, group and attempt (controller.json)."""
        with self._lock:
            return {"jobs": [[j.job_id, j.group, j.attempt, j.submitted, j.cancelled] for j in self.jobs.values() if not j.final]}

    def restore_handles(self, handles: dict) -> None:
        with self._lock:
            for job_id, group, attempt, submitted, cancelled in handles.get("jobs", []):
                job = _Job(str(job_id), int(group), int(attempt), float(submitted))
                job.cancelled = bool(cancelled)
                self.jobs[job.job_id] = job
                if group not in self.current or self.current[group].attempt < job.attempt:
                    self.current[group] = job
        self._refresh(force=True)

    def adopt(self, launch: RankLaunch, identity, report_path: str) -> RankProcess:
        """The rank's task in its group's recorded job (by job id); a rank of no recorded job
        (it ended before the last save) is watched by pid and start time like launcher=local's."""
        job = next((j for j in self.jobs.values() if (j.group, j.attempt) == (launch.group, launch.attempt)), None)
        if job is None:
            return AdoptedProcess(launch, identity, report_path)
        rank = SlurmRank(launch, job, self)
        job.ranks.append(rank)
        return rank

    def __init__(self, run_dir: str, options: Options) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.options = options
        self.env = dict(os.environ)
        conf = options.slurm_conf or os.environ.get("SLURM_CONF")
        if conf:
            self.env["SLURM_CONF"] = os.path.abspath(conf)
        self.slurm_conf = self.env.get("SLURM_CONF")
        self.jobs: dict[str, _Job] = {}
        self.current: dict[int, _Job] = {}
        self._snap_time = 0.0
        self._lock = threading.Lock()
        self._nodes_cache: Optional[list[str]] = None
        self._addr_cache: Optional[dict[str, str]] = None
        # group -> the slot of the promoted standby now serving it (place_group).
        self._placement: dict[int, int] = {}
        # Nodes new jobs are kept off (sbatch --exclude): the controller's suspects (exclude_nodes).
        self._exclude: set[str] = set()
        # Slurm's view of every node (node_states): name -> sinfo state, and when it was read.
        self._node_states: dict[str, str] = {}
        self._node_snap = 0.0
        # A local cluster of simulated nodes (monarch_ft.launcher.slurm_nodes): nodes that can fail.
        self.sim_nodes = read_record(self.slurm_conf)
        self._downs: dict[str, dict] = {}  # node -> its node_down fault in flight (timer, undo)
        self._down_lock = threading.Lock()

    # ------------------------------------------------------------ commands
    def _cmd(self, *argv: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        try:
            out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmError(f"launcher=slurm: {argv[0]} not found on PATH: install Slurm (apt-get install slurm-wlm) or add its bin directory to PATH")
        except subprocess.TimeoutExpired:
            raise SlurmError(f"launcher=slurm: {' '.join(argv[:2])} timed out after {timeout:.0f} s: {self._unreachable_hint()}")
        if check and out.returncode != 0:
            msg = _short(out.stderr or out.stdout)
            if "contact" in msg.lower() or "connection refused" in msg.lower() or "unable to establish" in msg.lower():
                raise SlurmError(f"launcher=slurm: {self._unreachable_hint()} ({msg})")
            raise SlurmError(f"launcher=slurm: {' '.join(argv[:2])} failed: {msg}")
        return out

    def _unreachable_hint(self) -> str:
        where = f"SLURM_CONF={self.slurm_conf}" if self.slurm_conf else "Slurm's default slurm.conf"
        return f"cannot reach slurmctld ({where}): start slurmctld or set launcher.options.slurm_conf"

    def check(self) -> None:
        """Fail early, in one line: no sbatch, no slurm.conf, controller down."""
        for tool in ("sbatch", "squeue", "scancel", "scontrol"):
            if shutil.which(tool, path=self.env.get("PATH")) is None:
                raise SlurmError(f"launcher=slurm: {tool} not found on PATH: install Slurm (apt-get install slurm-wlm) or add its bin directory to PATH")
        if self.slurm_conf and not os.path.isfile(self.slurm_conf):
            source = "launcher.options.slurm_conf" if self.options.slurm_conf else "$SLURM_CONF"
            raise SlurmError(f"{source}={self.slurm_conf}: no such file")
        out = self._cmd("scontrol", "ping", timeout=30, check=False)
        if "UP" not in out.stdout:
            raise SlurmError(f"launcher=slurm: {self._unreachable_hint()} ({_short(out.stdout or out.stderr, 200)})")
        if self.options.partition:
            parts = self._cmd("sinfo", "--noheader", "-o", "%R").stdout.split()
            if self.options.partition not in parts:
                raise SlurmError(f"launcher.options.partition={self.options.partition!r}: no such partition (have {', '.join(parts)})")

    # ------------------------------------------------------------ layout
    def nodes(self) -> list[str]:
        """Node names of the partition (sinfo)."""
        if self._nodes_cache is None:
            argv = ["sinfo", "--noheader", "-N", "-o", "%N"]
            if self.options.partition:
                argv += ["-p", self.options.partition]
            self._nodes_cache = sorted(set(self._cmd(*argv).stdout.split()))
        return self._nodes_cache

    def _group_node(self, group: int) -> Optional[str]:
        pinned = self.options.nodes
        slot = self._placement.get(group, group)  # a group a promoted standby serves: its slot
        return pinned[slot % len(pinned)] if pinned else None

    def place_group(self, group: int, slot: int) -> None:
        """A promoted standby's job (launched as group ``slot``) is now ``group``'s current job:
        a node fault or cancel_group on ``group`` hits it, and its pinned node is the group's."""
        with self._lock:
            job = self.current.pop(slot, None)
            if job is not None:
                self.current[group] = job
        self._placement[group] = self._placement.pop(slot, slot)

    def group_host(self, group: int) -> str:
        """A pinned group's node's address; unpinned, "": the node is Slurm's choice, so each
        rank takes the address its node reaches the Lighthouse from (rank.trainer)."""
        node = self._group_node(group)
        if node is None:
            return ""
        address = self._node_addresses().get(node, node)
        if node in _local_names() or address in _local_names():
            return "127.0.0.1"
        return socket.gethostbyname(address)

    def control_host(self) -> str:
        """Where the Lighthouse must listen: the address this machine reaches the job's nodes
        from (the pinned ones, else the partition's); loopback when every node is this machine."""
        names = self.options.nodes or self.nodes()
        addresses = self._node_addresses()
        remote = [addresses.get(n, n) for n in names if n not in _local_names() and addresses.get(n, n) not in _local_names()]
        for address in remote:
            try:
                return route_to(address)
            except OSError:
                continue
        return "127.0.0.1" if not remote else socket.gethostbyname(_HOSTNAME)

    def _node_addresses(self) -> dict[str, str]:
        """Each node's NodeAddr (sinfo %o), where Slurm reaches its slurmd."""
        if self._addr_cache is None:
            argv = ["sinfo", "--noheader", "-N", "-o", "%N|%o"]
            out = self._cmd(*argv, check=False).stdout
            self._addr_cache = dict(line.split("|", 1) for line in out.split() if "|" in line)
        return self._addr_cache

    def describe(self) -> dict:
        try:
            hosts: Any = self.options.nodes or self.nodes()
        except SlurmError:
            hosts = "unknown"
        return {"launcher": self.name, "hosts": hosts, "slurm_conf": self.slurm_conf, "partition": self.options.partition}

    # ------------------------------------------------------------ launch
    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        if not ranks:
            return []
        group, attempt, standby = ranks[0].group, ranks[0].attempt, ranks[0].standby
        d = os.path.join(self.run_dir, "slurm")
        os.makedirs(d, exist_ok=True)
        # A warm standby is a job of its own (a node fault on a group's job never takes it),
        # named by its number; its group is the slot it is placed on (see place_group).
        tag = f"sb{standby}" if standby is not None else f"g{group}.a{attempt}"
        manifest = os.path.join(d, f"{tag}.json")
        ranks = sorted(ranks, key=lambda r: r.rank)
        for r in ranks:
            os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
            for path in (r.log_path + ".exit", r.log_path + ".pid"):
                if os.path.exists(path):
                    os.remove(path)
        with open(manifest, "w") as f:
            json.dump(
                {
                    "supervisor_pid": os.getpid(),
                    "supervisor_host": _HOSTNAME,
                    "supervisor_pid_space": _PID_SPACE,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "argv": r.argv,
                            "env": r.env,
                            "cwd": r.cwd,
                            "log_path": r.log_path,
                            "exit_path": r.log_path + ".exit",
                            "pid_path": r.log_path + ".pid",
                            "die_with_controller": r.die_with_controller,
                            # Once this file exists the standby trains as a group: it outlives the controller.
                            "promotion_path": RunLayout(self.run_dir).promotion(standby) if standby is not None else None,
                            # Applied by the task wrapper to the rank's process (a standby's build yields the cores).
                            "niceness": r.niceness,
                        }
                        for r in ranks
                    ],
                },
                f,
            )
        o = self.options
        m = len(ranks)
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={o.job_name}-{tag.replace('.', '')}",
            f"#SBATCH --ntasks={m}",
            "#SBATCH --nodes=1",
            f"#SBATCH --cpus-per-task={o.cpus_per_task}",
            f"#SBATCH --output={os.path.join(self.run_dir, 'logs', f'slurm-{tag}-%j.out')}",
            f"#SBATCH --chdir={ranks[0].cwd}",
            "#SBATCH --no-requeue",
        ]
        if o.partition:
            lines.append(f"#SBATCH --partition={o.partition}")
        node = self._group_node(group)
        excluded: Optional[tuple[str, ...]] = None if node else tuple(sorted(self._exclude))
        if node:
            lines.append(f"#SBATCH --nodelist={node}")
        elif excluded:
            lines.append(f"#SBATCH --exclude={','.join(excluded)}")
        # The task wrapper is this package's own module, run without site-packages (-S) and
        # without the job's cwd on sys.path (-P), from the repository the supervisor runs.
        task = [sys.executable, "-P", "-S", "-m", TASK_MODULE, manifest]
        lines.append(f"export PYTHONPATH={shlex.quote(REPO_ROOT)}")
        lines.append(f"srun --ntasks={m} --kill-on-bad-exit=0 " + " ".join(shlex.quote(a) for a in task))
        script = os.path.join(d, f"{tag}.sbatch")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        submitted = time.time()
        out = self._cmd("sbatch", "--parsable", *o.sbatch_args, script, check=False)
        if out.returncode != 0:
            msg = _short(out.stderr or out.stdout)
            if "contact" in msg.lower() or "connection refused" in msg.lower():
                raise SlurmError(f"launcher=slurm: {self._unreachable_hint()} ({msg})")
            raise SlurmError(f"launcher=slurm: sbatch rejected group {group}'s job: {msg}")
        job_id = out.stdout.strip().split(";")[0]
        job = _Job(job_id, group, attempt, submitted, standby)
        job.excluded = excluded
        job.ranks = [SlurmRank(r, job, self) for r in ranks]
        with self._lock:
            self.jobs[job_id] = job
            self.current[group] = job
        if standby is None:  # a standby still pending must not hold up the supervisor
            self._wait_started(job)
        return list(job.ranks)

    def _wait_started(self, job: _Job) -> None:
        """Until every rank reported its pid (the job runs), the job ended, or start_timeout_s;
        a job Slurm still holds pending for a reason after PENDING_WAIT_S (no node free: one
        excluded, or down) is left to the supervisor's startup timeout, whose watch loop is
        not held up meanwhile."""
        deadline = time.time() + self.options.start_timeout_s
        while time.time() < deadline:
            if all(r.info() is not None or r._read_exit() is not None for r in job.ranks):
                return
            self._refresh()
            if job.final:
                return
            if job.state == "PENDING" and job.reason not in ("None", "") and time.time() - job.submitted > PENDING_WAIT_S:
                return
            time.sleep(0.05)

    # ------------------------------------------------------------ watch
    def _refresh(self, force: bool = False) -> None:
        """One squeue for every job not yet final, at most once per poll_interval_s."""
        with self._lock:
            now = time.time()
            if not force and now - self._snap_time < self.options.poll_interval_s:
                return
            active = [j for j in self.jobs.values() if not j.final]
            if not active:
                self._snap_time = now
                return
            try:
                out = subprocess.run(
                    ["squeue", "--noheader", "--states=all", "-o", "%i|%T|%N|%r", "-j", ",".join(j.job_id for j in active)],
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired):
                self._snap_time = now
                return
            self._snap_time = now
            seen: dict[str, tuple[str, str, str]] = {}
            if out.returncode == 0:
                for line in out.stdout.splitlines():
                    parts = line.strip().split("|")
                    if len(parts) == 4:
                        seen[parts[0]] = (parts[1], parts[2], parts[3])
            elif "invalid job id" not in (out.stderr or "").lower():
                return  # controller briefly unreachable: keep what we knew
            for j in active:
                if j.job_id in seen:
                    j.state, node, j.reason = seen[j.job_id]
                    if node and node != "(null)":
                        j.node = node
                elif now > j.submitted:
                    j.state = None  # purged from the controller: ended long ago
                if j.final and j.final_seen is None:
                    j.final_seen = now

    def job_state(self, group: int) -> Optional[str]:
        """Slurm state of the group's current job (PENDING, RUNNING, COMPLETED, ...)."""
        job = self.current.get(group)
        if job is None:
            return None
        self._refresh()
        return job.state

    def _exit_info(self, job: _Job) -> tuple[str, int, int]:
        if job.exit_info is None:
            state, code, sig = job.state or "", 0, 0
            out = subprocess.run(["scontrol", "show", "job", "-o", job.job_id], env=self.env, capture_output=True, text=True, timeout=30)
            for field in out.stdout.split():
                if field.startswith("JobState="):
                    state = field.split("=", 1)[1]
                elif field.startswith("ExitCode="):
                    a, _, b = field.split("=", 1)[1].partition(":")
                    code, sig = int(a or 0), int(b or 0)
            # Slurm reports a cancelled job's batch script as killed by SIGTERM/SIGKILL
            # even when the rank itself never ran: keep that as the rank's signal.
            job.exit_info = (state, code, sig)
        return job.exit_info

    def _signal_job(self, job: _Job, sig: int) -> None:
        self._refresh()
        if job.state == "PENDING" and sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self._cancel(job)
        elif not job.final:
            self._cmd("scancel", f"--signal={signal.Signals(sig).name[3:]}", "--full", job.job_id, check=False)

    def _cancel(self, job: _Job, kill: bool = False) -> None:
        if job.cancelled:
            return
        job.cancelled = True
        if kill:
            self._cmd("scancel", "--signal=KILL", "--full", job.job_id, check=False)
        self._cmd("scancel", job.job_id, check=False)

    def _lose(self, job: _Job) -> None:
        """A task of ``job`` vanished with its node (or the node stopped answering Slurm): its
        other tasks are lost too, and the job is cancelled so that Slurm frees the allocation
        as soon as it can (a node that does not answer: once Slurm counts it down)."""
        if job.lost:
            return
        job.lost = True
        try:
            self._cancel(job)
        except SlurmError:
            pass

    def _release_if_done(self, job: _Job) -> None:
        """Once no rank of the job is left, cancel the job so its allocation is freed now."""
        if any(r._killed for r in job.ranks) and all(r._killed or r._code is not None for r in job.ranks) and not job.final:
            self._cancel(job)

    # ------------------------------------------------------------ chaos helpers
    def cancel_group(self, group: int) -> Optional[str]:
        """Cancel the group's current job (Slurm's own stop: SIGTERM, SIGKILL after KillWait)."""
        job = self.current.get(group)
        if job is None or job.final:
            return None
        job.cancelled = True
        self._cmd("scancel", job.job_id)
        return job.job_id

    def group_node(self, group: int) -> Optional[str]:
        job = self.current.get(group)
        if job is None:
            return None
        for r in job.ranks:
            if r.node:
                return r.node
        self._refresh(force=True)
        return job.node

    def drain_node(self, node: str, reason: str = "monarch_ft fault", down: bool = True) -> None:
        """Take a node out: ``down`` (default) also kills its jobs, as a node failure; else DRAIN
        (running jobs continue, no new ones)."""
        state = "DOWN" if down else "DRAIN"
        self._cmd("scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}")

    def resume_node(self, node: str) -> None:
        self._cmd("scontrol", "update", f"nodename={node}", "state=RESUME")

    # ------------------------------------------------------------ nodes
    def take_placements(self) -> list[dict]:
        """Jobs that started since the last call, each once: which node Slurm gave it and how
        long the allocation took (``sbatch`` to its first task running, by the task
        wrappers' clocks: this machine's, or the nodes' where they keep time with it)."""
        placed = []
        with self._lock:
            jobs = [j for j in self.jobs.values() if not j.placed]
        for job in jobs:
            infos = [r.info() for r in job.ranks]
            if not infos or any(i is None for i in infos):
                if job.final:
                    job.placed = True  # ended before every task ran: never placed
                continue
            job.placed = True
            node = next((i.get("node") for i in infos if i.get("node")), job.node)
            started = min((i["started"] for i in infos if i.get("started")), default=None)
            placed.append(
                {
                    "group": job.group if job.standby is None else None,
                    "standby": job.standby,
                    "attempt": job.attempt,
                    "job_id": job.job_id,
                    "node": node,
                    "nodes": sorted({i.get("node") for i in infos if i.get("node")}),
                    "allocation_s": round(started - job.submitted, 3) if started else None,
                }
            )
        return placed

    def node_states(self) -> dict[str, str]:
        """Every node's state as Slurm sees it (``sinfo -N %T``: ``idle``, ``allocated*``,
        ``down*``...), read at most once per ``node_poll_interval_s``; the last one read
        while slurmctld does not answer."""
        now = time.time()
        if now - self._node_snap < self.options.node_poll_interval_s:
            return self._node_states
        self._node_snap = now
        argv = ["sinfo", "--noheader", "-N", "-o", "%N|%T"]
        if self.options.partition:
            argv += ["-p", self.options.partition]
        try:
            out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return self._node_states
        if out.returncode == 0:
            self._node_states = dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)
        return self._node_states

    def node_health(self, state: str) -> NodeHealth:
        return node_health(state)

    def node_lost(self, node: Optional[str]) -> bool:
        """Slurm, at its last read, counted ``node`` not responding or down."""
        state = self._node_states.get(node or "")
        return state is not None and node_health(state) in (NodeHealth.NOT_RESPONDING, NodeHealth.DOWN)

    def exclude_nodes(self, nodes: set[str]) -> None:
        """Keep every job submitted from now on off ``nodes`` (``sbatch --exclude``); a group
        pinned to a node (``nodes``) keeps it."""
        self._exclude = set(nodes)

    def pending_allocations(self) -> dict[str, tuple[str, ...]]:
        """This launcher's jobs Slurm holds pending (as of its last squeue) that were submitted
        with an exclusion list, with it (a job pinned to a node is not concerned)."""
        with self._lock:
            return {j.job_id: j.excluded for j in self.jobs.values() if j.state == "PENDING" and j.excluded is not None}

    def replan_pending(self, job_id: str, exclude: set[str]) -> bool:
        """``scontrol update JobId=N ExcNodeList=...`` (an empty list clears it): a pending job
        submitted while nodes were out may run on one that came back. Slurm refuses it for a job
        no longer pending (False)."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        nodes = tuple(sorted(exclude))
        out = self._cmd("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}", check=False)
        if out.returncode != 0:
            return False
        job.excluded = nodes
        return True

    @property
    def capabilities(self) -> set:
        return {Capability.NODE_DOWN} if self.sim_nodes else set()

    def node_down(self, group: int, seconds: float, on_restore: Optional[Callable[[dict], None]] = None) -> dict:
        """Take ``group``'s node down as a machine fails (:func:`~monarch_ft.launcher.slurm_nodes.take_down`:
        link cut, every process on it killed, slurmd with them; Slurm is not told) and bring
        it back after ``seconds`` (slurmd restarted, the node resumed), then ``on_restore``."""
        node = self.group_node(group)
        sim = self.sim_nodes.get(node or "")
        if sim is None:
            raise RuntimeError(
                f"group {group}'s node {node!r} is not a simulated node: a node_down fault needs a local cluster of simulated nodes "
                "(python -m monarch_ft.testing.slurm_cluster --nodes N DIR)"
            )
        with self._down_lock:
            if sim.name in self._downs:
                raise RuntimeError(f"node {sim.name} is already down")
            started = time.time()
            self._downs[sim.name] = {"started": started}
        details = take_down(sim)
        self.restore_node_after(sim.name, seconds, on_restore)
        return {**details, "duration_s": seconds}

    def restore_node_after(self, node: str, seconds: float, on_restore: Optional[Callable[[dict], None]] = None) -> bool:
        """Bring a node this launcher took down back ``seconds`` from now (then ``on_restore``),
        in place of when its timer was due, if it had one: the one place a return is scheduled
        (:meth:`node_down`, and a chaos ``node_down`` timed from the next fault). False when it
        is not down."""
        with self._down_lock:
            down = self._downs.get(node)
            if down is None:
                return False
            old = down.get("timer")
            if old is not None:
                old.cancel()
            timer = down["timer"] = restore_later(seconds, lambda: self.restore_node(node), on_restore)
            timer.start()
        return True

    def restore_node(self, node: str) -> Optional[dict]:
        """Bring a node this launcher took down back now (also what its timer does); None if none is down."""
        with self._down_lock:
            down = self._downs.pop(node, None)
        if down is None:
            return None
        timer = down.get("timer")
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        info = bring_up(self.sim_nodes[node])
        now = time.time()
        return {**info, "restored_at": now, "lasted_s": round(now - down["started"], 3)}

    # ------------------------------------------------------------ close
    def close(self, timeout: float = 10.0) -> None:
        """Cancel this launcher's jobs still queued or running and wait until they ended;
        bring back any node it took down (the cluster is left as it was found)."""
        for node in list(self._downs):
            try:
                self.restore_node(node)
            except Exception:
                pass
        self._refresh(force=True)
        live = [j for j in self.jobs.values() if not j.final]
        # Jobs whose ranks all ended finish by themselves (COMPLETED): give them a moment.
        deadline = time.time() + 3.0
        while time.time() < deadline and any(all(r.poll() is not None for r in j.ranks) for j in live):
            time.sleep(0.1)
            self._refresh(force=True)
            live = [j for j in live if not j.final]
        for j in live:
            try:
                self._cancel(j, kill=True)
            except SlurmError:
                pass
        deadline = time.time() + timeout
        while live and time.time() < deadline:
            time.sleep(0.2)
            self._refresh(force=True)
            live = [j for j in live if not j.final]


LAUNCHER = SlurmLauncher


def build(cfg, run_dir: str) -> SlurmLauncher:
    launcher = SlurmLauncher(run_dir, Options.parse(cfg.options, cfg.name))
    launcher.check()
    return launcher
