"""``model``: which TorchTitan model the ranks train."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ModelConfig:
    """A TorchTitan model: ``flavor`` names an entry of ``torchtitan.models.<name>``'s args."""

    name: str = "llama3"
    """The TorchTitan model (a package ``torchtitan.models.<name>`` with flavors)."""

    flavor: str = "debugmodel"
    """The model's size, a key of ``torchtitan.models.<name>.<name>_args``. ``debugmodel``: llama3's
    smallest (6 layers, dim 256), which trains on CPU."""

    dim: Optional[int] = None
    """Override of the flavor's model width (TransformerModelArgs ``dim``); null: the flavor's."""

    n_layers: Optional[int] = None
    """Override of the flavor's number of transformer blocks; null: the flavor's."""

    n_heads: Optional[int] = None
    """Override of the flavor's number of attention heads (must divide ``dim``); null: the flavor's."""

    vocab_size: int = 2048
    """Tokens in the vocabulary: the size of the tokenizer trained on the corpus, and the bound on
    every id of a token file given as ``data.path``. 2048 keeps the debug model's embedding small."""
