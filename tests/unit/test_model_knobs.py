"""TorchTitan's knobs on the model a rank builds (monarch_ft.rank.components.model.build_model):
activation checkpointing changes no number, bf16 is FSDP's mixed-precision policy (a group of one
rank too), and a parameter keeps one name whatever wraps it. torch.compile's effect is measured
by benchmarks/knobs_parity.py (its compilation takes minutes on this machine's 2 cores)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from monarch_ft.config.model import ModelConfig
from monarch_ft.config.training import TrainingConfig
from monarch_ft.rank.components.model import build_model, param_name

TINY = ModelConfig(dim=64, n_layers=2, n_heads=4)
SEQ = 32


@pytest.fixture
def one_rank(tmp_path):
    """A process group of one rank (gloo), as a rank of a one-rank group has."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _step(training: TrainingConfig):
    """One forward and backward of the same batch: (loss, logits dtype, {name: grad}, model)."""
    model = build_model(TINY, SEQ, None, torch.device("cpu"), seed=0, training=training)
    tokens = torch.randint(0, TINY.vocab_size, (2, SEQ + 1), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    grads = {param_name(n): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone() for n, p in model.named_parameters()}
    return float(loss), logits.dtype, grads, model


def test_activation_checkpointing_recomputes_exactly(one_rank):
    loss, dtype, grads, plain = _step(TrainingConfig())
    for mode in ("selective", "full"):
        ac_loss, ac_dtype, ac_grads, model = _step(TrainingConfig(activation_checkpoint=mode))
        assert any("_checkpoint_wrapped_module" in n for n, _ in model.named_parameters()), "TorchTitan's checkpoint wrapper is on every block"
        assert ac_grads.keys() == grads.keys(), "one name per parameter whatever wraps it"
        assert ac_loss == loss and ac_dtype == dtype == torch.float32
        assert all(torch.equal(ac_grads[n], grads[n]) for n in grads), f"{mode}: the recomputed forward is the same computation"


def test_bf16_is_fsdps_mixed_precision_policy_even_for_one_rank(one_rank):
    from torch.distributed.fsdp import FSDPModule

    loss, _, grads, _ = _step(TrainingConfig())
    bf_loss, bf_dtype, bf_grads, model = _step(TrainingConfig(mixed_precision="bf16"))
    assert isinstance(model, FSDPModule) and model._get_fsdp_state()._mp_policy.param_dtype == torch.bfloat16
    assert bf_dtype == torch.bfloat16, "computed in bfloat16"
    assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights float32"
    assert all(g.dtype == torch.float32 for g in bf_grads.values()), "gradients reduced to float32"
    assert bf_grads.keys() == grads.keys()
    assert bf_loss != loss and abs(bf_loss - loss) < 0.01 * loss, "the same model, rounded to bfloat16 (8 bits of mantissa)"
