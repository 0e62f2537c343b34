"""``model``: which TorchTitan model the ranks train."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ModelConfig:
    """A TorchTitan model: ``flavor`` names an entry of ``torchtitan.models.<name>``'s args."""

    name: str = "llama3"
    flavor: str = "debugmodel"
    # Optional overrides of the flavor's TransformerModelArgs.
    dim: Optional[int] = None
    n_layers: Optional[int] = None
    n_heads: Optional[int] = None
    vocab_size: int = 2048
