"""Which device a rank trains on and which backends carry its collectives.

``training.device``: ``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu`` or ``cuda``.
Inside a group the backend follows the device (NCCL on CUDA: FSDP2's reduce-scatter needs
it; gloo on CPU). Across groups ``ft.cross_group_backend`` picks torchft's
``ProcessGroupNCCL`` or ``ProcessGroupGloo`` (``auto``: NCCL on CUDA, gloo on CPU);
torchft's gloo group also takes CUDA tensors (it registers itself for the cuda device).

GPUs: on one host, rank ``r`` of group ``g`` (``M`` ranks per group) uses
``cuda:((g * M + r) % device_count)``, so groups spread over the host's GPUs and share
them only when there are fewer GPUs than ranks. NCCL refuses two ranks of one
communicator on one GPU of one host ("Duplicate GPU detected": its check compares the
peers' host hash and PCI bus id), so when groups share a GPU the cross-group NCCL group
needs ``ft.nccl_hostid_per_group=true``: each group then sets its own ``NCCL_HOSTID``,
NCCL takes the groups for different hosts and connects them through its network (socket)
transport. Ranks of one group never share a GPU (their NCCL group would be refused too).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket

DEVICES = ("auto", "cpu", "cuda")
CROSS_GROUP_BACKENDS = ("auto", "nccl", "gloo")


def gpu_device_nodes() -> bool:
    """Cheap hint, no torch import: could this host have an NVIDIA GPU at all (any NVIDIA
    device node, or nvidia-smi)? False means certainly none; True is settled by torch."""
    return bool(glob.glob("/dev/nvidia*")) or shutil.which("nvidia-smi") is not None


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_type(setting: str) -> str:
    """``cuda`` or ``cpu`` for ``training.device`` on this host (``auto``: CUDA if torch sees a GPU)."""
    if setting == "auto":
        return "cuda" if cuda_device_count() > 0 else "cpu"
    return setting


def cuda_index(group: int, rank: int, ranks_per_group: int, device_count: int) -> int:
    return (group * ranks_per_group + rank) % device_count


def cross_group_backend(setting: str, dev_type: str) -> str:
    if setting == "auto":
        return "nccl" if dev_type == "cuda" else "gloo"
    return setting


def groups_share_a_gpu(replica_groups: int, ranks_per_group: int, device_count: int) -> bool:
    """Whether some rank of one group lands on the same GPU as the same rank of another
    (all groups on one host): the pairs a cross-group communicator joins."""
    seen = set()
    for g in range(replica_groups):
        for r in range(ranks_per_group):
            key = (r, cuda_index(g, r, ranks_per_group, device_count))
            if key in seen:
                return True
            seen.add(key)
    return False


def set_nccl_hostid(group: int) -> str:
    """Give this process (one rank of ``group``) a host id of its own group; must run
    before the process's first NCCL communicator is created (NCCL reads it then)."""
    host_id = f"{socket.gethostname()}-monarch-ft-group{group}"
    os.environ["NCCL_HOSTID"] = host_id
    return host_id


def device_problem(device: str, cross_backend: str, hostid_per_group: bool, replica_groups: int, ranks_per_group: int) -> str | None:
    """Why this device/backend choice cannot run with every rank on this host, or None
    (both settings already among DEVICES / CROSS_GROUP_BACKENDS)."""
    if device == "cpu" or (device == "auto" and not gpu_device_nodes()):
        if cross_backend == "nccl":
            return "ft.cross_group_backend=nccl needs CUDA: the ranks train on CPU here (training.device); use gloo or auto"
        if hostid_per_group:
            return "ft.nccl_hostid_per_group=true has no effect: the ranks train on CPU here (training.device), with no NCCL: drop it"
        return None
    count = cuda_device_count()
    if count == 0:
        if device == "cuda":
            import torch

            return (
                f"training.device=cuda: torch sees no CUDA device here (torch {torch.__version__}, CUDA {torch.version.cuda}); use training.device=cpu or auto"
            )
        if cross_backend == "nccl":
            return "ft.cross_group_backend=nccl needs CUDA: torch sees no GPU here; use gloo or auto"
        return None
    if ranks_per_group > count:
        return (
            f"ft.ranks_per_group={ranks_per_group} on {count} GPU(s): two ranks of one group would share a GPU, which NCCL refuses; "
            "lower ft.ranks_per_group or use training.device=cpu"
        )
    nccl_across = cross_group_backend(cross_backend, "cuda") == "nccl"
    if nccl_across and not hostid_per_group and groups_share_a_gpu(replica_groups, ranks_per_group, count):
        return (
            f"{replica_groups} groups x {ranks_per_group} ranks on {count} GPU(s): groups share a GPU, which NCCL refuses in the "
            "cross-group communicator; set ft.nccl_hostid_per_group=true (NCCL over its socket transport) or ft.cross_group_backend=gloo"
        )
    return None
