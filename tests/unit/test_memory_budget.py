"""The pre-flight memory estimate (monarch_ft.controller.memory_budget): the parameters counted
from TorchTitan's source, the state per rank under FSDP, and a job that cannot fit refused in one
line before launch."""

from __future__ import annotations

import pytest

from monarch_ft.common.model_catalog import param_count
from monarch_ft.config.model import ModelConfig
from monarch_ft.controller.memory_budget import GIB, estimate, refusal

LLAMA3_1B = ModelConfig(flavor="8B", dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5, multiple_of=256, vocab_size=128256)
CONFIGS = {
    "debugmodel": ModelConfig(),
    "tiny": ModelConfig(dim=64, n_layers=2, n_heads=4),
    "llama3_1b": LLAMA3_1B,
    "llama3_8b": ModelConfig(flavor="8B", vocab_size=128256),
}


def _count(cfg: ModelConfig) -> int | None:
    return param_count(cfg.name, cfg.flavor, {"vocab_size": cfg.vocab_size, **cfg.overrides()})


def test_parameters_counted_from_the_source_are_those_torchtitan_builds():
    """Read without importing torch on the controller; here checked against the model itself,
    built on the meta device (no memory) as a rank builds it."""
    import torch

    from monarch_ft.rank.components.model import model_args

    import torchtitan.models.llama3 as llama3

    for name, cfg in CONFIGS.items():
        with torch.device("meta"):
            model = llama3.Transformer(model_args(cfg, 128, "cpu"))
        assert _count(cfg) == sum(p.numel() for p in model.parameters()), name
    assert _count(CONFIGS["llama3_8b"]) == 8_030_261_248 and _count(LLAMA3_1B) == 1_498_482_688


def test_the_config_groups_select_those_shapes():
    from hydra import compose, initialize_config_dir

    from monarch_ft.cli.run import CONFIG_DIR, to_job_config

    for name in ("llama3_1b", "llama3_8b", "tiny", "debugmodel"):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="flavors"):
            model = to_job_config(compose(config_name="pretrain", overrides=[f"model={name}"])).model
        assert _count(model) == _count(CONFIGS[name]), name


def test_other_architectures_are_not_estimated():
    assert param_count("qwen3", "0.6B", {}) is None and param_count("llama3", "nonsense", {}) is None


def test_state_per_rank_is_sharded_by_fsdp_and_counted_for_every_rank_on_the_host():
    est = estimate(params=1_000_000_000, ranks_per_group=4, groups=2, standby_groups=1)
    assert est.per_rank_bytes == 4_000_000_000, "16 bytes a parameter over 4 shards"
    assert est.ranks == 12 and est.total_bytes == 48_000_000_000, "2 groups and the standby group, 4 ranks each"
    # On GPUs: the ranks spread over them (cuda_index), the most any one GPU takes.
    assert estimate(1_000_000_000, 2, 3, 0, gpus=4).ranks == 2


def test_a_job_that_cannot_fit_is_one_line_with_the_estimate_and_the_limit():
    params = 1_498_482_688
    est, one = estimate(params, 2, 2, 1), estimate(params, 2, 1, 0)
    assert refusal("llama3/8B", est, int(200 * GIB), "this host", one) is None
    message = refusal("llama3/8B", est, int(24 * GIB), "this host", one)
    assert message == (
        "model llama3/8B (1.50B parameters) needs at least 67.0 GiB on this host: 6 ranks x 11.16 GiB of float32 parameters, "
        "gradients and AdamW state (16 bytes a parameter, sharded over the 2 rank(s) of a group; activations not counted), "
        "more than the 24.0 GiB of this host: lower ft.replica_groups or ft.standby_groups, or choose a smaller model"
    )
    on_gpu = refusal("llama3/8B", est, int(10 * GIB), "one GPU", one)
    assert on_gpu.endswith("more than the 10.0 GiB of one GPU: choose a smaller model (one group alone needs more)")


@pytest.mark.parametrize("model", ["llama3_8b"])
def test_preflight_refuses_a_model_this_host_cannot_hold(tmp_path, model):
    """Selectable, estimated, and refused here before anything starts (8B: 120 GiB for one group)."""
    from monarch_ft.testing.jobs import config_refusal

    message = config_refusal(tmp_path, f"model={model} ft.replica_groups=1 ft.standby_groups=0")
    assert message.startswith("model llama3/8B (8.03B parameters) needs at least 119.7 GiB on this host: 2 ranks x 59.83 GiB"), message
    assert "GiB of this host: choose a smaller model" in message
