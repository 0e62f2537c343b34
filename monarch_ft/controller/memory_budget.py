"""The pre-flight memory estimate: does the job's training state fit the machine it runs on?

A model too big for the host is otherwise found out by the kernel's OOM killer, in every group
at once, after the launch and the data; a restart then fails the same way until the restart
budget is spent. So the controller counts, before launch, what every rank must hold whatever
else it does:

- the parameters, float32 (FSDP's sharded master weights: also under ``bf16``, whose bfloat16
  copies are all-gathered per block and freed);
- their gradients, float32 (FSDP reduces them to sharded float32 gradients);
- AdamW's two moments, float32;

16 bytes a parameter, divided by the ranks of a group (FSDP shards all three evenly), times the
ranks on one host: every group's and every warm standby group's (a standby builds the whole
model and its optimizer state before it is needed). Activations, communication buffers and
the framework's own memory come on top and are not counted: the estimate is a lower bound, and
a job it refuses certainly cannot run. Training on a GPU, the state lives in GPU memory and the
limit is the smallest GPU's memory, for the ranks that share it.

The parameters are counted from TorchTitan's source (:func:`monarch_ft.common.model_catalog.param_count`),
for its llama3 (other architectures are not estimated). The pure decisions (:func:`estimate`,
:func:`refusal`) are apart from the machine readings (:func:`host_memory_bytes`, :func:`gpu_memory_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# float32 parameter + float32 gradient + AdamW's exp_avg and exp_avg_sq (float32).
BYTES_PER_PARAM = 4 + 4 + 8
GIB = float(1 << 30)
# cgroup v1 reports "no limit" as a number near 2**63.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class MemoryEstimate:
    """What the ranks of one host (or one GPU) hold at least.

    Args:
        params: the model's parameters.
        ranks_per_group: FSDP's shard count.
        ranks: the ranks whose state shares the limit (a host's, or a GPU's).
    """

    params: int
    ranks_per_group: int
    ranks: int

    @property
    def per_rank_bytes(self) -> int:
        """One rank's sharded parameters, gradients and AdamW state."""
        return math.ceil(self.params * BYTES_PER_PARAM / self.ranks_per_group)

    @property
    def total_bytes(self) -> int:
        return self.per_rank_bytes * self.ranks


def estimate(params: int, ranks_per_group: int, groups: int, standby_groups: int, gpus: int = 0) -> MemoryEstimate:
    """The state the ranks sharing one limit hold.

    Args:
        params: the model's parameters.
        ranks_per_group: ``ft.ranks_per_group``.
        groups: ``ft.replica_groups`` on this host.
        standby_groups: warm standby groups on this host.
        gpus: 0 on CPU (every rank's state in host memory); else the GPUs the ranks spread
            over (monarch_ft.common.devices.cuda_index), the most ranks one of them takes.
    """
    ranks = (groups + standby_groups) * ranks_per_group
    if gpus:
        ranks = math.ceil(ranks / gpus)
    return MemoryEstimate(params=params, ranks_per_group=ranks_per_group, ranks=ranks)


def refusal(model: str, est: MemoryEstimate, limit_bytes: int, where: str, one_group: MemoryEstimate) -> Optional[str]:
    """One line giving the estimate and the limit when the state cannot fit, else None.

    Args:
        model: the model as the user named it (``llama3/8B``).
        est: the job's estimate.
        limit_bytes: the memory of ``where``.
        where: ``this host`` or ``one GPU``.
        one_group: the estimate with one group and no standby (what the fix can get down to).
    """
    if est.total_bytes <= limit_bytes:
        return None
    if one_group.total_bytes <= limit_bytes:
        fix = "lower ft.replica_groups or ft.standby_groups, or choose a smaller model"
    else:
        fix = "choose a smaller model (one group alone needs more)"
    return (
        f"model {model} ({est.params / 1e9:.2f}B parameters) needs at least {est.total_bytes / GIB:.1f} GiB on {where}: "
        f"{est.ranks} ranks x {est.per_rank_bytes / GIB:.2f} GiB of float32 parameters, gradients and AdamW state "
        f"(16 bytes a parameter, sharded over the {est.ranks_per_group} rank(s) of a group; activations not counted), "
        f"more than the {limit_bytes / GIB:.1f} GiB of {where}: {fix}"
    )


def host_memory_bytes() -> int:
    """This host's memory as the ranks can use it: the machine's, or the memory cgroup's
    limit where that is lower (a container)."""
    import psutil

    total = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < _NO_LIMIT:
            total = min(total, int(value))
    return total


def gpu_memory_bytes() -> tuple[int, int]:
    """(the number of GPUs torch sees, the smallest one's memory in bytes)."""
    import torch

    count = torch.cuda.device_count()
    return count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
