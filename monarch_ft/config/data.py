"""``data``: what the ranks train on (:mod:`monarch_ft.common.data`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from monarch_ft.common.data import TEXT_SUFFIXES, TOKEN_SUFFIXES
from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import require

CORPORA = ("stdlib",)


@dataclass
class DataConfig:
    """What the ranks train on (monarch_ft/common/data.py); prepared once by the controller."""

    corpus: str = "stdlib"
    """The built-in corpus, used when ``path`` is unset: ``stdlib``, the Python standard library's
    own sources (text shipped with every Python install; also what the tokenizer is trained on).
    It is the only one: another name is refused. Your own text or tokens: ``data.path``."""

    path: Optional[str] = None
    """Data of your own instead of the corpus, relative to the launch directory: text (.txt .md
    .rst .py; one document), a Hugging Face dataset on disk (a folder saved by ``save_to_disk``,
    .parquet, .jsonl/.json or .arrow files, or a folder of them; each row's ``text_column`` one
    document), both tokenised once and cached; or token ids (.npy 1-D integers; .bin/.u16 raw
    little-endian uint16; .u32 raw uint32), every id below ``model.vocab_size``."""

    tokenizer: Optional[str] = None
    """A Hugging Face ``tokenizers`` file (``tokenizer.json``, or a folder holding one; a
    ``tokenizer_config.json`` beside it names its begin- and end-of-text tokens) that encodes the
    text instead of the project's own tokenizer; its largest id must be below
    ``model.vocab_size``. Without ``path``, it encodes the stdlib corpus."""

    text_column: str = "text"
    """The column of a dataset ``path`` that holds each document's text."""

    max_corpus_mb: float = 4.0
    """Megabytes of the standard library's sources the corpus (and the tokenizer trained on it)
    takes. Unused when the project's tokenizer is not (a token file as ``path``, or ``tokenizer``
    given with a ``path``)."""

    cache_dir: Optional[str] = None
    """Where the trained tokenizer and the token files are cached; null: ``<repo>/.cache/monarch_ft`` in a
    checkout, ``$XDG_CACHE_HOME/monarch_ft`` (``~/.cache/monarch_ft``) for an installed package."""

    def check(self) -> None:
        """What the types cannot say about this section (one line naming the fix)."""
        require(
            self.corpus in CORPORA,
            f"data.corpus={self.corpus}: the only built-in corpus is {', '.join(CORPORA)} (the standard library's sources); "
            "to train on your own text or token ids give data.path=FILE",
        )
        require(self.max_corpus_mb > 0, f"data.max_corpus_mb={self.max_corpus_mb}: must be > 0")
        require(bool(self.text_column), "data.text_column is empty: name the dataset's column that holds the text")
        suffix = os.path.splitext(self.path or "")[1].lower()
        if suffix in TOKEN_SUFFIXES:
            refuse_unused(self, "data", ("tokenizer",), f"with the token file data.path={self.path} (its ids are made already)", "drop it")
        if not self.path or suffix in TOKEN_SUFFIXES + TEXT_SUFFIXES:
            refuse_unused(self, "data", ("text_column",), "without a dataset as data.path (only a dataset has columns)", "drop it")
