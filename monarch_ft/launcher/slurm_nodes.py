"""Slurm nodes that are simulated hosts: what a machine failure does to one, and its return.

A local multi-node cluster (:mod:`monarch_ft.testing.slurm_cluster`, ``--nodes N``) runs each
node's ``slurmd`` on a simulated host (:mod:`monarch_ft.launcher.hosts`: its own network
namespace, address and host name on a bridge) and records the nodes next to its
``slurm.conf`` (:data:`RECORD`). The Slurm launcher reads that record, and only then can it
take a node down the way a machine fails (:func:`take_down`):

1. its link is cut first: from then on it sends nothing, so its peers see silence (their
   collectives time out, the Lighthouse stops hearing its Managers), not closed connections;
2. every process on it, ``slurmd``, ``slurmstepd``, the task wrappers and the ranks, is
   frozen (SIGSTOP) and then killed: a frozen task wrapper cannot record how its rank
   ended, as none would on a machine that lost power.

Nobody tells Slurm: ``slurmctld`` finds the node silent by its own pings (``SlurmdTimeout``)
and marks it ``NOT_RESPONDING``, then ``DOWN``, failing its jobs (``NODE_FAIL``).
:func:`bring_up` is the machine coming back: link up, ``slurmd`` started again, and
``scontrol update state=resume`` (a node Slurm set ``DOWN`` for not responding also returns
by itself once its ``slurmd`` registers: ``ReturnToService=1``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from monarch_ft.launcher.hosts import enter_host, netns_pids, set_veth
from monarch_ft.records.layout import atomic_write_json, read_json

# The record a local cluster of simulated nodes writes next to its slurm.conf.
RECORD = "simulated_nodes.json"


@dataclass(frozen=True)
class SimulatedNode:
    """One Slurm node on a simulated host.

    Args:
        name: its Slurm ``NodeName``, also its host name (and its network namespace's name).
        netns: its network namespace.
        address: its ``NodeAddr`` on the bridge.
        veth: the root-namespace end of its link.
        slurmd: the argv of its ``slurmd`` (run on its host: :func:`~monarch_ft.launcher.hosts.enter_host`).
        log: where its ``slurmd``'s own output goes (``SlurmdLogFile`` has the log proper).
        slurm_conf: the cluster's ``slurm.conf`` (``SLURM_CONF`` of its ``slurmd`` and of
            ``scontrol``).
    """

    name: str
    netns: str
    address: str
    veth: str
    slurmd: list
    log: str
    slurm_conf: str


def record_path(slurm_conf: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(slurm_conf)), RECORD)


def write_record(slurm_conf: str, nodes: list[SimulatedNode]) -> None:
    atomic_write_json(record_path(slurm_conf), {"nodes": [dataclasses.asdict(n) for n in nodes]})


def read_record(slurm_conf: Optional[str]) -> dict[str, SimulatedNode]:
    """The simulated nodes of the cluster of ``slurm_conf``, by name ({} for a cluster of
    real machines, or one whose record is unreadable)."""
    if not slurm_conf:
        return {}
    try:
        record = read_json(record_path(slurm_conf), {}) or {}
        return {n["name"]: SimulatedNode(**n) for n in record.get("nodes", [])}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _env(node: SimulatedNode) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"), "SLURM_CONF": node.slurm_conf}


def start_slurmd(node: SimulatedNode) -> subprocess.Popen:
    """Start the node's ``slurmd`` on its host (its namespace, hosts file and host name: it
    finds its ``NodeName`` by its host name; its job steps inherit all three), in a session
    of its own: it outlives whoever started it (the cluster, or a controller bringing a
    failed node back), as a machine's daemon does."""
    with open(node.log, "ab") as log:
        return subprocess.Popen(
            list(node.slurmd),
            env=_env(node),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=enter_host(node.netns, node.name),
        )


def take_down(node: SimulatedNode, timeout_s: float = 10.0) -> dict:
    """The node fails as a machine does: link cut, then every process on it frozen and killed.

    Returns:
        What was done, for the ``fault_injected`` event: the node, its namespace and link,
        how many processes were killed and how long that took.
    """
    started = time.time()
    set_veth(node.veth, up=False)
    frozen: set[int] = set()
    # Frozen before any is killed: a task wrapper must not see its rank die and record it.
    # Repeated while new pids show up (a process that forked in between).
    for _ in range(10):
        fresh = [p for p in netns_pids(node.netns) if p not in frozen]
        if not fresh:
            break
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
            frozen.add(pid)
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    deadline = time.time() + timeout_s
    while netns_pids(node.netns) and time.time() < deadline:
        time.sleep(0.05)
    return {"node": node.name, "netns": node.netns, "veth": node.veth, "link": "down", "killed": len(frozen), "seconds": round(time.time() - started, 3)}


def bring_up(node: SimulatedNode) -> dict:
    """The failed node back: link up, ``slurmd`` started again, the node resumed in Slurm.

    Returns:
        The new ``slurmd``'s pid and whether ``scontrol`` resumed the node (False: Slurm had
        not set it DOWN, or had returned it already on its ``slurmd``'s registration).
    """
    set_veth(node.veth, up=True)
    slurmd = start_slurmd(node)
    resume = subprocess.run(
        ["scontrol", "update", f"nodename={node.name}", "state=resume"], env=_env(node), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    return {"node": node.name, "slurmd_pid": slurmd.pid, "resumed": resume.returncode == 0}


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
