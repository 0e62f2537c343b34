"""TorchTitan's model, built and sharded for one replica group, with TorchTitan's knobs.

The model, its activation checkpointing, its compilation and its FSDP2 wrapping are
TorchTitan's own (``torchtitan.models``, ``torchtitan.distributed.activation_checkpoint.apply_ac``,
the model's ``apply_compile`` and ``apply_fsdp``), applied in the order TorchTitan's own
``parallelize_llama`` applies them: activation checkpointing, then ``torch.compile`` per
transformer block, then FSDP. Only the device mesh is built here (by the trainer), because
TorchTitan's ``ParallelDims.build_mesh`` assumes an accelerator and falls back to ``cuda`` on CPU.

The knobs (``training.mixed_precision``, ``training.activation_checkpoint``, ``training.compile``):

- ``bf16``: FSDP's mixed-precision policy, as TorchTitan sets it (parameters all-gathered and
  computed in bfloat16, gradients reduced in float32, the sharded master weights and AdamW's
  state float32). A group of one rank gets FSDP over a mesh of one rank too: the policy is
  FSDP's, and without it there would be no bf16 at all.
- ``selective``: TorchTitan's per-op selective checkpointing (``selective_ac_option="op"``): each
  block keeps the outputs of the ops in TorchTitan's save list (every other matmul, the
  attention) and recomputes the rest in backward. ``full``: each block recomputed whole.
- ``compile``: each transformer block compiled with inductor, ``fullgraph=True``.
"""

from __future__ import annotations

import dataclasses
import importlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from monarch_ft.config.model import ModelConfig
from monarch_ft.config.training import TrainingConfig

# What TorchTitan's wrappers put into parameter names (checkpoint_wrapper, torch.compile's
# OptimizedModule). The names a heal, a fingerprint or a state hash use drop them, so one
# parameter has one name whatever the knobs.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def model_args(cfg: ModelConfig, seq_len: int, device_type: str | None = None):
    """The flavor's TransformerModelArgs with the config's overrides applied
    (``device_type``: where it will train; None: CUDA if torch sees a GPU)."""
    module = importlib.import_module(f"torchtitan.models.{cfg.name}")
    flavors = getattr(module, f"{cfg.name}_args", None)
    if flavors is None or cfg.flavor not in flavors:
        known = ", ".join(sorted(flavors or {}))
        raise ValueError(f"model.flavor={cfg.flavor!r} is not a {cfg.name} flavor: choose one of {known}")
    overrides = {k: v for k, v in cfg.overrides().items() if v is not None}
    args = dataclasses.replace(flavors[cfg.flavor], vocab_size=cfg.vocab_size, max_seq_len=seq_len, **overrides)
    # CPU backward exists only for SDPA; FlexAttention/varlen flavors are GPU-only.
    on_cuda = torch.cuda.is_available() if device_type is None else device_type == "cuda"
    if not on_cuda and getattr(args, "attn_type", "sdpa") != "sdpa":
        raise ValueError(f"model.flavor={cfg.flavor!r} uses {args.attn_type} attention, which has no CPU backward: use an sdpa flavor")
    return args


def param_name(name: str) -> str:
    """A parameter's name without TorchTitan's wrappers (activation checkpointing, compile)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _apply_ac(model: nn.Module, mode: str) -> None:
    """TorchTitan's activation checkpointing of every transformer block (``mode``: selective|full)."""
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    apply_ac(model, ActivationCheckpoint(mode=mode, selective_ac_option="op"), op_sac_save_list=_op_sac_save_list)


def _apply_compile(model: nn.Module) -> None:
    """TorchTitan's per-block ``torch.compile`` (inductor, fullgraph)."""
    from torchtitan.config.job_config import Compile
    from torchtitan.models.llama3.infra.parallelize import apply_compile

    apply_compile(model, Compile(enable=True, components=["model"], backend="inductor"))


def build_model(
    cfg: ModelConfig,
    seq_len: int,
    mesh: DeviceMesh | None,
    device: torch.device,
    seed: int,
    training: TrainingConfig | None = None,
) -> nn.Module:
    """The model, its knobs applied, sharded over ``mesh`` and initialised.

    Same seed on every group -> identical initial weights without an init sync (the knobs
    change no initial weight: they wrap modules, they do not re-create them).

    Args:
        cfg: the model section.
        seq_len: ``training.seq_len`` (the model's ``max_seq_len``).
        mesh: the group's FSDP mesh; None or one rank: no FSDP (unless bf16 asks for its policy).
        device: where the rank trains.
        seed: ``training.seed``.
        training: the knobs (``mixed_precision``, ``activation_checkpoint``, ``compile``);
            None: fp32, none, false.
    """
    training = training or TrainingConfig()
    module = importlib.import_module(f"torchtitan.models.{cfg.name}")
    args = model_args(cfg, seq_len, device.type)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = module.Transformer(args)
    if training.activation_checkpoint != "none":
        _apply_ac(model, training.activation_checkpoint)
    if training.compile:
        _apply_compile(model)
    bf16 = training.mixed_precision == "bf16"
    if bf16 and (mesh is None or mesh.size() == 1):
        from torch.distributed.device_mesh import init_device_mesh

        # One rank: FSDP over a mesh of one, for its mixed-precision policy (nothing is sharded).
        mesh = mesh if mesh is not None else init_device_mesh(device.type, (1,), mesh_dim_names=("fsdp",))
    if mesh is not None and (mesh.size() > 1 or bf16):
        from torchtitan.models.llama3.infra.parallelize import apply_fsdp

        param_dtype = torch.bfloat16 if bf16 else torch.float32
        apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32, pp_enabled=False)
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
