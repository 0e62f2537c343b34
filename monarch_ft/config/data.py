"""``data``: what the ranks train on (:mod:`monarch_ft.common.data`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DataConfig:
    """What the ranks train on (monarch_ft/common/data.py); prepared once by the controller."""

    # Text shipped with every Python install: the standard library's own sources (used
    # when ``path`` is unset; also what the tokenizer is trained on).
    corpus: str = "stdlib"
    # A file of your own instead: text (.txt .md .rst .py; tokenised with the project's
    # tokenizer, cached) or token ids (.npy 1-D integers; .bin/.u16 raw little-endian
    # uint16; .u32 raw uint32), every id below model.vocab_size. Relative to the launch directory.
    path: Optional[str] = None
    max_corpus_mb: float = 4.0
    # Where the trained tokenizer and token file are cached; None: <repo>/.cache/monarch_ft.
    cache_dir: Optional[str] = None
