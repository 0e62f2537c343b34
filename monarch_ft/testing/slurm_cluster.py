"""A real, single-node Slurm cluster on this machine, without systemd (for tests and trying it out).

    with LocalSlurmCluster("/tmp/slurm", cpus=4) as cluster:
        # cluster.conf is the slurm.conf; pass launcher.options.slurm_conf=<cluster.conf>
        subprocess.run(["sinfo"], env=cluster.env())

It starts its own ``munged`` (own key, socket, pid and seed files), ``slurmctld`` and
``slurmd`` (both in the foreground, ``-D``) on free private ports, with every state and
spool directory under ``workdir``; accounting is off (no slurmdbd), so job state comes
from squeue/scontrol. On exit it stops slurmd, slurmctld and munged and checks that none
of them (nor any job step) is left running.

Also a command line: ``python -m monarch_ft.testing.slurm_cluster WORKDIR`` starts one and
prints the ``SLURM_CONF`` to use until Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd")


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
    def __init__(self, workdir: str, cpus: int = 4, cluster_name: str = "monarchft", start_timeout_s: float = 30.0) -> None:
        self.workdir = os.path.abspath(workdir)
        self.cpus = cpus
        self.cluster_name = cluster_name
        self.start_timeout_s = start_timeout_s
        self.hostname = socket.gethostname()
        self.node = self.hostname
        self.conf = os.path.join(self.workdir, "etc", "slurm.conf")
        self.munge_socket = os.path.join(self.workdir, "munge", "run", "munge.socket")
        self.procs: dict[str, subprocess.Popen] = {}
        self._munged_pid: Optional[int] = None
        self.ctld_port = 0
        self.slurmd_port = 0

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

    def node_state(self) -> str:
        out = self.run("sinfo", "--noheader", "-N", "-n", self.node, "-o", "%T", check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""

    def pids(self) -> list[int]:
        """Pids of this cluster's daemons still alive."""
        out = [p.pid for p in self.procs.values() if p.poll() is None]
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
        for sub in ("etc", "munge/run", "munge/lib", "munge/log", "state", "spool", "log", "run"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
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
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.hostname}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={w}/run/slurmctld.pid",
            f"SlurmdPidFile={w}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd.log",
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
            "SlurmdTimeout=30",
            "MessageTimeout=10",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

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
        for name in ("slurmctld", "slurmd"):
            log = open(os.path.join(self.workdir, "log", f"{name}.stdout"), "ab")
            argv = [_which(name), "-D", "-f", self.conf]
            if name == "slurmctld":
                argv.append("-i")  # ignore any stale state of a previous run in this workdir
            self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
        deadline = time.time() + self.start_timeout_s
        state = ""
        while time.time() < deadline:
            for name in ("slurmctld", "slurmd"):
                p = self.procs[name]
                if p.poll() is not None:
                    raise SlurmClusterError(
                        f"{name} exited ({p.returncode}): {_tail(os.path.join(self.workdir, 'log', name + '.log'))} "
                        f"{_tail(os.path.join(self.workdir, 'log', name + '.stdout'))}"
                    )
            state = self.node_state()
            if state.rstrip("*") in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.2)
        raise SlurmClusterError(
            f"node {self.node} not idle after {self.start_timeout_s:.0f} s (state {state!r}): {_tail(os.path.join(self.workdir, 'log', 'slurmd.log'))}"
        )

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        # Cancel whatever is still queued or running, then stop the daemons in order.
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--signal=KILL", "--user", _current_user(), timeout=5, check=False)
                self.run("scancel", "--user", _current_user(), timeout=5, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
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
        if not left:
            self.procs.clear()
        else:
            raise SlurmClusterError(f"processes left behind after stopping the cluster: {[(p.pid, p.name()) for p in left]}")


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m monarch_ft.testing.slurm_cluster WORKDIR", file=sys.stderr)
        return 2
    # Ctrl-C or SIGTERM stop the cluster cleanly (its daemons with it); SIGINT is reset because a
    # shell starts a background job with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.default_int_handler(signal.SIGINT, None))
    with LocalSlurmCluster(argv[0]) as cluster:
        print(f"Slurm cluster up: node {cluster.node}, {cluster.cpus} CPUs")
        print(f"  export SLURM_CONF={cluster.conf}")
        print(f"  launcher=slurm launcher.options.slurm_conf={cluster.conf}")
        print("Ctrl-C (or SIGTERM) stops it.", flush=True)
        try:
            while all(p.poll() is None for p in cluster.procs.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
