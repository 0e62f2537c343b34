"""``data``: what the ranks train on (:mod:`monarch_ft.common.data`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
    """A file of your own instead of the corpus, relative to the launch directory: text (.txt .md
    .rst .py; tokenised with the project's tokenizer, cached) or token ids (.npy 1-D integers;
    .bin/.u16 raw little-endian uint16; .u32 raw uint32), every id below ``model.vocab_size``."""

    max_corpus_mb: float = 4.0
    """Megabytes of the standard library's sources the corpus (and the tokenizer trained on it)
    takes. Unused when ``path`` names a token file (no tokenizer is needed)."""

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
