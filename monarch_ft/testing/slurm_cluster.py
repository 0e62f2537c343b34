"""A real Slurm cluster on this machine, without systemd (for tests and trying it out).

    with LocalSlurmCluster("/tmp/slurm", cpus=4) as cluster:           # one node: this machine
        # cluster.conf is the slurm.conf; pass launcher.options.slurm_conf=<cluster.conf>
        subprocess.run(["sinfo"], env=cluster.env())
    with LocalSlurmCluster("/tmp/slurm", cpus=2, nodes=4) as cluster:  # four simulated nodes
        cluster.node_down(cluster.nodes[1]); cluster.node_up(cluster.nodes[1])

It starts its own ``munged`` (own key, socket, pid and seed files), ``slurmctld`` and
``slurmd`` (in the foreground, ``-D``) on free private ports, with every state and spool
directory under ``workdir`` (the spool through a link to a short path where ``workdir`` is long:
slurmstepd's sockets there must fit a Unix socket path's 108 bytes); accounting is off (no slurmdbd), so job state comes from
squeue/scontrol. On exit it stops every slurmd, slurmctld and munged and checks that none
of them (nor any job step) is left running, and removes the simulated nodes.

With ``nodes=N`` each node is a simulated host (:mod:`monarch_ft.launcher.hosts`: its own
network namespace, address on a bridge, and host name, which is its ``NodeName``) running
its own ``slurmd`` (its own spool directory, pid file and log: ``log/slurmd-<node>.log``).
``slurmctld`` listens on the bridge address. ``munged`` is shared (its socket is a file, as
the run directories are: the machine's filesystem is the cluster's shared filesystem).
Slurm's timeouts are set so that it notices a dead node within seconds
(:data:`NODE_TIMEOUTS`); :meth:`LocalSlurmCluster.node_down` fails a node as a machine
does and :meth:`LocalSlurmCluster.node_up` brings it back
(:mod:`monarch_ft.launcher.slurm_nodes`, which the Slurm launcher uses for node faults, from
the record the cluster leaves next to its slurm.conf).

Also a command line: ``python -m monarch_ft.testing.slurm_cluster [--nodes N] WORKDIR``
starts one and prints the ``SLURM_CONF`` to use until Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

import psutil

from monarch_ft.launcher import slurm_nodes
from monarch_ft.records.errors import ConfigError
from monarch_ft.launcher.slurm_nodes import SimulatedNode

DAEMONS = ("munged", "slurmctld", "slurmd")
# Slurm's timeouts on a cluster of simulated nodes, chosen so that it tells a dead node
# within seconds (its defaults take minutes: SlurmdTimeout=300). slurmctld pings every node
# each SlurmdTimeout/3 s; a ping its slurmd does not answer (TCPTimeout to connect,
# MessageTimeout for the round trip) marks the node NOT_RESPONDING, and a node silent for
# SlurmdTimeout is set DOWN, its jobs failed (NODE_FAIL). The one-node cluster keeps the
# larger ones it always had: its only node is this machine, which does not fail.
NODE_TIMEOUTS = {"SlurmdTimeout": 6, "MessageTimeout": 3, "TCPTimeout": 2}
MACHINE_TIMEOUTS = {"SlurmdTimeout": 30, "MessageTimeout": 10}


class SlurmClusterError(RuntimeError):
    """The cluster could not start: the message says which piece and why (one line)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read()[-n:].strip().splitlines()[-4:])
    except OSError:
        return "(no log)"


def missing_binaries() -> list[str]:
    return [
        b
        for b in ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
        if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")
    ]


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurmCluster:
    """A Slurm cluster on this machine.

    Args:
        workdir: where its configuration, state, spool directories and logs go.
        cpus: CPUs of each node.
        cluster_name: its ClusterName.
        start_timeout_s: how long :meth:`start` waits for every node to be idle.
        nodes: None: one node, this machine (NodeAddr 127.0.0.1); N: N simulated nodes.
    """

    def __init__(self, workdir: str, cpus: int = 4, cluster_name: str = "monarchft", start_timeout_s: float = 30.0, nodes: Optional[int] = None) -> None:
        if nodes is not None and nodes < 1:
            raise SlurmClusterError(f"nodes={nodes}: a cluster needs at least one node")
        self.workdir = os.path.abspath(workdir)
        self.cpus = cpus
        self.cluster_name = cluster_name
        self.start_timeout_s = start_timeout_s
        self.hostname = socket.gethostname()
        self.simulated = nodes is not None
        self.hosts = None  # SimulatedHosts, for simulated nodes
        self.sim_nodes: dict[str, SimulatedNode] = {}
        self.nodes: list[str] = [] if self.simulated else [self.hostname]
        self._wanted_nodes = nodes or 1
        self.conf = os.path.join(self.workdir, "etc", "slurm.conf")
        self.munge_socket = os.path.join(self.workdir, "munge", "run", "munge.socket")
        self.procs: dict[str, subprocess.Popen] = {}
        self._munged_pid: Optional[int] = None
        self.ctld_port = 0
        self.slurmd_port = 0
        self.spool = os.path.join(self.workdir, "spool")
        self._short_spool: Optional[str] = None

    @property
    def node(self) -> str:
        """The first node (the only one of a one-node cluster)."""
        return self.nodes[0]

    # ------------------------------------------------------------------ public
    def env(self) -> dict[str, str]:
        """os.environ with SLURM_CONF pointing at this cluster (for sbatch, squeue, ...)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = self.conf
        return env

    def run(self, *argv: str, timeout: float = 15.0, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[:300]}")
        return out

    def node_state(self, node: Optional[str] = None) -> str:
        """Slurm's state of ``node`` (default: the first), as sinfo prints it (``idle``, ``down*``...)."""
        out = self.run("sinfo", "--noheader", "-N", "-n", node or self.node, "-o", "%T", check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "-N", "-o", "%N|%T", check=False)
        return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)

    def node_down(self, node: str) -> dict:
        """Fail simulated node ``node`` as a machine fails (link cut, every process on it killed);
        Slurm is not told (:func:`monarch_ft.launcher.slurm_nodes.take_down`)."""
        return slurm_nodes.take_down(self.sim_nodes[node])

    def node_up(self, node: str) -> dict:
        """Bring ``node`` back: link up, its slurmd started again, the node resumed."""
        return slurm_nodes.bring_up(self.sim_nodes[node])

    def pids(self) -> list[int]:
        """Pids of this cluster's daemons still alive (a slurmd started again by whoever
        brought its node back included: by its pid file)."""
        out = [p.pid for p in self.procs.values() if p.poll() is None]
        for pid in self._slurmd_pids():
            if pid not in out:
                out.append(pid)
        if self._munged_pid and self._munged_pid not in out and psutil.pid_exists(self._munged_pid):
            try:
                if psutil.Process(self._munged_pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(self._munged_pid)
            except psutil.Error:
                pass
        return out

    def leftover_processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: its daemons, slurmstepd and job processes
        (found by their SLURM_CONF or by naming this cluster's files), never this process."""
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if p.pid in mine or p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cmd = p.info["cmdline"] or []
                if any(self.conf in part or self.munge_socket in part for part in cmd):
                    found[p.pid] = p
                    continue
                try:
                    if p.environ().get("SLURM_CONF") == self.conf:
                        found[p.pid] = p
                except psutil.Error:
                    pass
            except psutil.Error:
                continue
        for pid in self.pids():
            if pid not in found and pid not in mine:
                try:
                    found[pid] = psutil.Process(pid)
                except psutil.Error:
                    pass
        return list(found.values())

    def __enter__(self) -> "LocalSlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        missing = missing_binaries()
        if missing:
            raise SlurmClusterError(f"Slurm/munge not installed (missing {', '.join(missing)}): apt-get install slurm-wlm munge (scripts/install.sh does)")
        try:
            self._write_files()
            self._start_munged()
            self._start_slurm()
        except BaseException:
            self.stop()
            raise

    def _write_files(self) -> None:
        for sub in ("etc", "munge/run", "munge/lib", "munge/log", "state", "log", "run"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
        self._make_spool()
        # munged checks its socket directory's permissions: no group/other write.
        for sub in ("munge", "munge/run", "munge/lib", "munge/log"):
            os.chmod(os.path.join(self.workdir, sub), 0o755 if sub != "munge/lib" else 0o700)
        os.chmod(self.workdir, 0o755)
        key = os.path.join(self.workdir, "munge", "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = _free_port()
        w = self.workdir
        user = _current_user()
        if self.simulated:
            from monarch_ft.launcher.hosts import SimulatedHosts

            self.hosts = SimulatedHosts()
            hosts = [self.hosts.host(i) for i in range(self._wanted_nodes)]
            self.nodes = [h.netns for h in hosts]
            ctld_host = f"{self.hostname}({self.hosts.bridge_address})"
            node_lines = [f"NodeName={h.netns} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN" for h in hosts]
            timeouts = NODE_TIMEOUTS
            slurmd_argv = [_which("slurmd"), "-D", "-f", self.conf]
            self.sim_nodes = {
                h.netns: SimulatedNode(h.netns, h.netns, h.address, h.veth, slurmd_argv, os.path.join(w, "log", f"slurmd-{h.netns}.stdout"), self.conf)
                for h in hosts
            }
        else:
            ctld_host = self.hostname
            node_lines = [f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN"]
            timeouts = MACHINE_TIMEOUTS
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={ctld_host}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={w}/run/slurmctld.pid",
            f"SlurmdPidFile={w}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd-%n.log" if self.simulated else f"SlurmdLogFile={w}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            # Pending jobs (a relaunch while the old job completes) are retried every second.
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "ReturnToService=1",
            "SlurmdParameters=config_overrides",
            # Quick stops and no automatic requeue: the supervisor relaunches groups itself.
            "KillWait=2",
            "JobRequeue=0",
            "MinJobAge=300",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            *(f"{key}={value}" for key, value in timeouts.items()),
            *node_lines,
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        if self.simulated:
            slurm_nodes.write_record(self.conf, list(self.sim_nodes.values()))

    def _make_spool(self) -> None:
        """The slurmds' spool directory: ``workdir/spool``, or, where a step's socket in it
        (``<spool>/<node>/<node>_<job>.<step>``) would not fit a Unix socket path (108 bytes),
        a short directory under /tmp that ``workdir/spool`` links to (removed on stop)."""
        link = os.path.join(self.workdir, "spool")
        longest = max((len(n) for n in self.nodes), default=0) or 16  # simulated nodes are named later: mft<id>-h<i>
        if len(f"{link}/{'x' * longest}/{'x' * longest}_4294967294.4294967294") < 100:
            os.makedirs(link, exist_ok=True)
            self.spool = link
            return
        if os.path.islink(link):
            os.remove(link)
        self._short_spool = tempfile.mkdtemp(prefix="mftslurm-", dir="/tmp")
        os.chmod(self._short_spool, 0o755)
        os.symlink(self._short_spool, link)
        self.spool = self._short_spool

    def _start_munged(self) -> None:
        m = os.path.join(self.workdir, "munge")
        argv = [
            _which("munged"),
            "--foreground",
            f"--socket={self.munge_socket}",
            f"--key-file={m}/munge.key",
            f"--pid-file={m}/run/munged.pid",
            f"--seed-file={m}/lib/munged.seed",
            f"--log-file={m}/log/munged.log",
            "--num-threads=2",
        ]
        if os.geteuid() == 0:
            argv.append("--force")  # munged refuses root without it
        log = open(os.path.join(m, "log", "munged.stdout"), "ab")
        self.procs["munged"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self._munged_pid = self.procs["munged"].pid
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.procs["munged"].poll() is not None:
                raise SlurmClusterError(
                    f"munged exited ({self.procs['munged'].returncode}): "
                    f"{_tail(os.path.join(m, 'log', 'munged.log'))} {_tail(os.path.join(m, 'log', 'munged.stdout'))}"
                )
            if os.path.exists(self.munge_socket) and self._munge_works():
                return
            time.sleep(0.1)
        raise SlurmClusterError(f"munged did not answer on {self.munge_socket} within 10 s: {_tail(os.path.join(m, 'log', 'munged.log'))}")

    def _munge_works(self) -> bool:
        try:
            cred = subprocess.run([_which("munge"), "-n", "-S", self.munge_socket], capture_output=True, timeout=5)
            if cred.returncode != 0:
                return False
            out = subprocess.run([_which("unmunge"), "-S", self.munge_socket], input=cred.stdout, capture_output=True, timeout=5)
            return out.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_slurm(self) -> None:
        env = self.env()
        # slurmctld first (-i: ignore any stale state of a previous run in this workdir), then
        # each node's slurmd: this machine's, or one per simulated node in its namespace.
        daemons = [("slurmctld", [_which("slurmctld"), "-D", "-f", self.conf, "-i"])]
        if not self.simulated:
            daemons.append(("slurmd", [_which("slurmd"), "-D", "-f", self.conf]))
        for name, argv in daemons:
            with open(os.path.join(self.workdir, "log", f"{name}.stdout"), "ab") as log:
                self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        for node in self.sim_nodes.values():
            self.procs[f"slurmd:{node.name}"] = slurm_nodes.start_slurmd(node)
        deadline = time.time() + self.start_timeout_s
        states: dict[str, str] = {}
        while time.time() < deadline:
            for name, p in self.procs.items():
                if name != "munged" and p.poll() is not None:
                    log = name.replace("slurmd:", "slurmd-") if ":" in name else name
                    raise SlurmClusterError(
                        f"{name} exited ({p.returncode}): {_tail(os.path.join(self.workdir, 'log', log + '.log'))} "
                        f"{_tail(os.path.join(self.workdir, 'log', log + '.stdout'))}"
                    )
            states = self.node_states()
            if all(states.get(n, "").rstrip("*") in ("idle", "mixed", "allocated") and not states[n].endswith("*") for n in self.nodes):
                return
            time.sleep(0.2)
        waiting = {n: states.get(n, "") for n in self.nodes if states.get(n, "").rstrip("*") not in ("idle", "mixed", "allocated")}
        log = f"slurmd-{next(iter(waiting))}.log" if self.simulated and waiting else "slurmd.log"
        raise SlurmClusterError(f"nodes not idle after {self.start_timeout_s:.0f} s (states {waiting}): {_tail(os.path.join(self.workdir, 'log', log))}")

    def _slurmd_pids(self) -> list[int]:
        """The slurmd of every simulated node still running, by its pid file (whoever started it)."""
        pids = []
        for node in self.sim_nodes:
            try:
                with open(os.path.join(self.workdir, "run", f"slurmd-{node}.pid")) as f:
                    pid = int(f.read().strip())
                cmd = psutil.Process(pid).cmdline()
            except (OSError, ValueError, psutil.Error):
                continue
            if self.conf in cmd:
                pids.append(pid)
        return pids

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        # Cancel whatever is still queued or running, then stop the daemons in order.
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--signal=KILL", "--user", _current_user(), timeout=5, check=False)
                self.run("scancel", "--user", _current_user(), timeout=5, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        # Every slurmd, those started again after a node fault by another process included.
        for pid in self._slurmd_pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        slurmds = [name for name in self.procs if name.startswith("slurmd")]
        for name in (*slurmds, "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)
        # Anything still around that belongs to this cluster (slurmstepd, job scripts): kill it.
        deadline = time.time() + 5
        left = self.leftover_processes()
        while left and time.time() < deadline:
            for proc in left:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            time.sleep(0.1)
            left = self.leftover_processes()
        if self._short_spool is not None:
            shutil.rmtree(self._short_spool, ignore_errors=True)
            self._short_spool = None
        if self.hosts is not None:
            self.hosts.close()  # every namespace, link and the bridge (anything left in them killed)
            self.hosts = None
            try:
                os.remove(slurm_nodes.record_path(self.conf))
            except OSError:
                pass
        if not left:
            self.procs.clear()
        else:
            raise SlurmClusterError(f"processes left behind after stopping the cluster: {[(p.pid, p.name()) for p in left]}")


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m monarch_ft.testing.slurm_cluster", description="A local Slurm cluster, until Ctrl-C or SIGTERM.")
    parser.add_argument("--nodes", type=int, default=None, help="simulated nodes (network namespaces, as root); default: this machine as the one node")
    parser.add_argument("--cpus", type=int, default=None, help="CPUs of each node (default: 4, or 2 per simulated node)")
    parser.add_argument("workdir")
    args = parser.parse_args(argv)
    if args.nodes is not None and args.nodes < 1:
        print(f"monarch_ft: error: --nodes={args.nodes}: give at least 1", file=sys.stderr)
        return 2
    # Ctrl-C or SIGTERM stop the cluster cleanly (its daemons with it); SIGINT is reset because a
    # shell starts a background job with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.default_int_handler(signal.SIGINT, None))
    cluster = LocalSlurmCluster(args.workdir, cpus=args.cpus or (2 if args.nodes else 4), nodes=args.nodes)
    try:
        cluster.start()
    except (SlurmClusterError, ConfigError) as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # stopped while starting (start() stopped what it had started)
    try:
        print(f"Slurm cluster up: nodes {', '.join(cluster.nodes)}, {cluster.cpus} CPUs each")
        print(f"  export SLURM_CONF={cluster.conf}")
        print(f"  launcher=slurm launcher.options.slurm_conf={cluster.conf}")
        print("Ctrl-C (or SIGTERM) stops it.", flush=True)
        try:
            while all(p.poll() is None for name, p in cluster.procs.items() if not name.startswith("slurmd:")):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
