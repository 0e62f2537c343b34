"""Plain training with no torchft: the no-FT reference of benchmarks/ft_overhead.py and the goodput bench.

    python -m torch.distributed.run --standalone --nproc-per-node=N -m monarch_ft.recipes.noft_train SPEC_JSON

One rank of plain PyTorch HSDP: a (replicate, shard) device mesh, TorchTitan's FSDP2 over it, gloo,
the same model build, optimizer, LR schedule, gradient clipping and batches as a monarch_ft rank
(monarch_ft.rank.trainer), and nothing else: no torchft, no checkpoints, no state hashes. Whatever
a fault-tolerant job does beyond this is in a ratio against it.

The spec (JSON): ``model`` (ModelConfig fields), ``seq_len``, ``batch_size``, ``lr``, ``weight_decay``,
``warmup_steps``, ``seed``, ``groups``, ``ranks``, ``tokens_path``, ``steps`` (the schedule's length and
an upper bound), ``out`` (a directory), and optionally ``threads`` (torch threads per rank, default 1)
and ``deadline`` (seconds since the epoch: every rank stops at the first step that starts after it,
agreed by an all-reduce MAX of one integer per step so that no rank is left in a collective).

Writes ``rank{R}.json`` (``times``: seconds per step, ``losses``) for every rank and, for each group's
first rank, ``metrics.g{G}.jsonl``: one step record per step in metrics.jsonl's form
(monarch_ft.records.reports), so the goodput bench reads a no-FT run as it reads any job's.
"""

from __future__ import annotations

import json
import os
import sys
import time


def train(spec: dict) -> None:
    """Train one rank of the spec (see the module doc) under torchrun's environment.

    Args:
        spec: the run's spec.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.config.job_config import LRScheduler

    from monarch_ft.common.data import TokenBatches
    from monarch_ft.config.model import ModelConfig
    from monarch_ft.rank.components.model import build_model
    from monarch_ft.records.members import members_field

    torch.set_num_threads(int(spec.get("threads", 1)))
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (spec["groups"], spec["ranks"]), mesh_dim_names=("replicate", "shard"))
    group, grank = divmod(rank, spec["ranks"])
    model = build_model(ModelConfig(**spec["model"]), spec["seq_len"], mesh, torch.device("cpu"), spec["seed"])
    optimizers = OptimizersContainer(
        [model],
        torch.optim.AdamW,
        {"lr": spec["lr"], "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": spec["weight_decay"], "foreach": True},
    )
    schedulers = build_lr_schedulers(optimizers, LRScheduler(warmup_steps=spec["warmup_steps"]), spec["steps"])
    batches = TokenBatches(spec["tokens_path"], spec["batch_size"], spec["seq_len"], spec["seed"])
    params = [p for p in model.parameters()]
    deadline = spec.get("deadline")
    members = list(range(spec["groups"]))
    records: list[dict] = []
    times, losses = [], []
    dist.barrier()
    for step in range(spec["steps"]):
        if deadline is not None:
            late = torch.tensor([int(time.time() >= deadline)])
            dist.all_reduce(late, op=dist.ReduceOp.MAX)
            if late.item():
                break
        start = time.time()
        optimizers.zero_grad()
        inputs, labels = batches.batch(step, group, grank)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizers.step()
        schedulers.step()
        now = time.time()
        times.append(now - start)
        losses.append(float(loss.item()))
        if grank == 0:
            records.append(
                {
                    "type": "step",
                    "group": group,
                    "rank": 0,
                    "attempt": 0,
                    "step": step,
                    "committed": True,
                    "participating_groups": members_field(members),
                    "batch": step,
                    "sync": True,
                    "healed": False,
                    "mode": "noft",
                    "step_time_s": now - start,
                    "time": now,
                }
            )
    with open(os.path.join(spec["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"group": group, "rank": grank, "times": times, "losses": losses}, f)
    if grank == 0:
        with open(os.path.join(spec["out"], f"metrics.g{group}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    dist.destroy_process_group()


def command(spec: dict) -> list[str]:
    """The torchrun command line that runs ``spec`` (one process per rank).

    Args:
        spec: the run's spec.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={spec['groups'] * spec['ranks']}",
        "-m",
        "monarch_ft.recipes.noft_train",
        json.dumps(spec),
    ]


if __name__ == "__main__":
    train(json.loads(sys.argv[1]))
