"""``model``: which TorchTitan model the ranks train."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# The fields that override the flavor's TransformerModelArgs field of the same name.
OVERRIDES = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim_multiplier", "multiple_of")


@dataclass
class ModelConfig:
    """A TorchTitan model: ``flavor`` names an entry of ``torchtitan.models.<name>``'s args."""

    name: str = "llama3"
    """The TorchTitan model (a package ``torchtitan.models.<name>`` with flavors)."""

    flavor: str = "debugmodel"
    """The model's size, a key of ``torchtitan.models.<name>.<name>_args``. ``debugmodel``: llama3's
    smallest (6 layers, dim 256), which trains on CPU. Whole shapes are config groups
    (configs/model/): ``model=debugmodel`` (the default), ``tiny`` (2 layers, dim 64: tests and
    drills), ``llama3_1b`` (Llama 3.2 1B's shape, 1.50B parameters) and ``llama3_8b``
    (TorchTitan's 8B); the pre-flight memory estimate refuses what the machine cannot hold."""

    dim: Optional[int] = None
    """Override of the flavor's model width (TransformerModelArgs ``dim``); null: the flavor's."""

    n_layers: Optional[int] = None
    """Override of the flavor's number of transformer blocks; null: the flavor's."""

    n_heads: Optional[int] = None
    """Override of the flavor's number of attention heads (must divide ``dim``); null: the flavor's."""

    n_kv_heads: Optional[int] = None
    """Override of the flavor's number of key/value heads (grouped-query attention; must divide
    ``n_heads``); null: the flavor's."""

    ffn_dim_multiplier: Optional[float] = None
    """Override of the flavor's feed-forward width multiplier (TorchTitan's llama3: the hidden width
    is ``multiplier * 8 * dim / 3``, rounded up to ``multiple_of``); null: the flavor's."""

    multiple_of: Optional[int] = None
    """Override of what the feed-forward hidden width is rounded up to a multiple of; null: the flavor's."""

    vocab_size: int = 2048
    """Tokens in the vocabulary: the size of the tokenizer trained on the corpus, and the bound on
    every id of a token file given as ``data.path``, and at least the size of ``data.tokenizer``'s
    vocabulary. 2048 keeps the debug model's embedding small."""

    def overrides(self) -> dict[str, Any]:
        """The flavor's fields this config overrides (None: keep the flavor's)."""
        return {k: getattr(self, k) for k in OVERRIDES}
