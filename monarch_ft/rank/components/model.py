"""TorchTitan's model, built and sharded for one replica group.

The model and its FSDP2 wrapping are TorchTitan's own (``torchtitan.models`` and the
model's ``apply_fsdp``); only the device mesh is built here, because TorchTitan's
``ParallelDims.build_mesh`` assumes an accelerator and falls back to ``cuda`` on CPU.
"""

from __future__ import annotations

import dataclasses
import importlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from monarch_ft.config.model import ModelConfig


def model_args(cfg: ModelConfig, seq_len: int, device_type: str | None = None):
    """The flavor's TransformerModelArgs with the config's overrides applied
    (``device_type``: where it will train; None: CUDA if torch sees a GPU)."""
    module = importlib.import_module(f"torchtitan.models.{cfg.name}")
    flavors = getattr(module, f"{cfg.name}_args", None)
    if flavors is None or cfg.flavor not in flavors:
        known = ", ".join(sorted(flavors or {}))
        raise ValueError(f"model.flavor={cfg.flavor!r} is not a {cfg.name} flavor: choose one of {known}")
    overrides = {k: getattr(cfg, k) for k in ("dim", "n_layers", "n_heads") if getattr(cfg, k) is not None}
    args = dataclasses.replace(flavors[cfg.flavor], vocab_size=cfg.vocab_size, max_seq_len=seq_len, **overrides)
    # CPU backward exists only for SDPA; FlexAttention/varlen flavors are GPU-only.
    on_cuda = torch.cuda.is_available() if device_type is None else device_type == "cuda"
    if not on_cuda and getattr(args, "attn_type", "sdpa") != "sdpa":
        raise ValueError(f"model.flavor={cfg.flavor!r} uses {args.attn_type} attention, which has no CPU backward: use an sdpa flavor")
    return args


def build_model(cfg: ModelConfig, seq_len: int, mesh: DeviceMesh | None, device: torch.device, seed: int) -> nn.Module:
    """Same seed on every group -> identical initial weights without an init sync."""
    module = importlib.import_module(f"torchtitan.models.{cfg.name}")
    args = model_args(cfg, seq_len, device.type)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = module.Transformer(args)
    if mesh is not None and mesh.size() > 1:
        from torchtitan.models.llama3.infra.parallelize import apply_fsdp

        apply_fsdp(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
        if device.type == "cpu":
            # Gloo has no PREMUL_SUM/AVG reduce-scatter: reduce with SUM, divide locally.
            from torch.distributed.fsdp import FSDPModule

            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    model.train()
    return model
