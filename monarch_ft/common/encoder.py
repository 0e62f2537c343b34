"""A tokenizer, and how it frames the documents it encodes into the token file.

The token file is one stream of ids; a document ends where the model sees its end-of-text id
(and the next begins after its begin-of-text id, for a tokenizer that has one). The framing is
the one TorchTitan's ``HuggingFaceTokenizer`` gives its text datasets (``encode(text,
add_bos=True, add_eos=True)``), read without importing TorchTitan (seconds of torch import in
the controller):

- begin-of-text: ``bos_token`` of a ``tokenizer_config.json`` beside the tokenizer file (as
  TorchTitan and transformers read it); else the id the tokenizer's own post-processor puts
  before a text (Llama 3's ``<|begin_of_text|>``); else none;
- end-of-text: that config's ``eos_token``; else the first of :data:`END_OF_TEXT` in the
  vocabulary; else none (documents then run into each other, as they would in TorchTitan).

The project's own tokenizer (trained on the stdlib corpus) has no begin-of-text and ends each
document with ``<|eos|>``.

``data.tokenizer`` is any Hugging Face ``tokenizers`` file (``tokenizer.json``, or a folder
holding one, as a model's files on the Hub come). It is checked before anything is launched:
a file that is missing or not a tokenizer, or a vocabulary with an id the model's embedding
lacks (``>= model.vocab_size``), is one line (:class:`~monarch_ft.records.errors.ConfigError`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from monarch_ft.records.errors import ConfigError

# End-of-text tokens by the names common tokenizers give them (Llama 3, GPT-2 and most BPEs,
# SentencePiece models, this project's own, Gemma).
END_OF_TEXT = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<|eos|>", "<eos>")
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class TextEncoder:
    """A tokenizer file and its framing of documents.

    Args:
        path: the ``tokenizer.json``.
        digest: of the tokenizer's files (its cache key: another tokenizer, other tokens).
        vocab_size: the ids it can produce (its largest id + 1).
        bos: the id put before each document, or None.
        eos: the id put after each document, or None.
    """

    path: str
    digest: str
    vocab_size: int
    bos: Optional[int]
    eos: Optional[int]

    @property
    def dtype(self) -> np.dtype:
        """The token file's id type: uint16 while every id fits, else uint32."""
        return np.dtype("<u2") if self.vocab_size <= 1 << 16 else np.dtype("<u4")

    def load(self):
        """The ``tokenizers.Tokenizer`` (cheap: read when the ids are needed)."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(self.path)

    def encode_documents(self, tokenizer, texts: list[str]) -> list[int]:
        """The ids of ``texts``, each a whole document, framed (in parallel: ``encode_batch``).

        Args:
            tokenizer: :meth:`load`'s tokenizer (loaded once per file, not per batch).
            texts: the documents.
        """
        ids: list[int] = []
        for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
            if self.bos is not None:
                ids.append(self.bos)
            ids.extend(enc.ids)
            if self.eos is not None:
                ids.append(self.eos)
        return ids

    def encode_pieces(self, tokenizer, pieces: list[str]) -> list[int]:
        """The ids of one document given in ``pieces`` (a long text file cut at line ends),
        framed once: the pieces are encoded in parallel and joined."""
        ids = [] if self.bos is None else [self.bos]
        for enc in tokenizer.encode_batch(pieces, add_special_tokens=False):
            ids.extend(enc.ids)
        if self.eos is not None:
            ids.append(self.eos)
        return ids


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        if path.exists():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _special(config: dict, key: str) -> Optional[str]:
    """A special token of a tokenizer_config.json: a string, or {"content": ...}."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _framing(tokenizer, config: dict) -> tuple[Optional[int], Optional[int]]:
    """(begin-of-text id, end-of-text id) by the rules of the module's doc."""
    bos_name = _special(config, "bos_token")
    bos = tokenizer.token_to_id(bos_name) if bos_name else None
    if bos is None:
        # What the tokenizer's own post-processor puts before an empty text (Llama 3: its BOS).
        added = tokenizer.encode("").ids
        bos = added[0] if len(added) == 1 else None
    eos_name = _special(config, "eos_token")
    eos = tokenizer.token_to_id(eos_name) if eos_name else None
    for name in END_OF_TEXT if eos is None else ():
        eos = tokenizer.token_to_id(name)
        if eos is not None:
            break
    return bos, eos


def project_encoder(tokenizer_path: str) -> TextEncoder:
    """The project's own tokenizer (trained on the stdlib corpus): no BOS, ``<|eos|>`` after each document."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    return TextEncoder(
        path=tokenizer_path,
        digest=_digest(Path(tokenizer_path)),
        vocab_size=tokenizer.get_vocab_size(),
        bos=None,
        eos=tokenizer.token_to_id("<|eos|>"),
    )


def user_encoder(shown: str, vocab_size: int) -> TextEncoder:
    """``data.tokenizer``: the user's tokenizer file, checked against the model.

    Args:
        shown: ``data.tokenizer`` as given (a ``tokenizer.json``, or a folder holding one).
        vocab_size: ``model.vocab_size``; every id the tokenizer can produce must be below it.

    Raises:
        ConfigError: the file is missing or unreadable, or the vocabulary exceeds the model.
    """
    from tokenizers import Tokenizer

    def fail(problem: str) -> None:
        raise ConfigError(f"data.tokenizer={shown}: {problem}")

    path = Path(os.path.expanduser(shown)).resolve()
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            fail(f"is a folder without a {TOKENIZER_FILE}; give the Hugging Face tokenizer file itself")
        path = path / TOKENIZER_FILE
    elif not path.exists():
        fail(f"no such file; give the path of a Hugging Face {TOKENIZER_FILE} on this machine")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with serde's message
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail(f"is not a Hugging Face tokenizers file ({why}); give a {TOKENIZER_FILE} saved by tokenizers or transformers")
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        fail("has an empty vocabulary")
    size = max(vocab.values()) + 1
    if size > vocab_size:
        fail(
            f"its vocabulary has ids up to {size - 1}, beyond model.vocab_size={vocab_size}: "
            f"set model.vocab_size={size} or more (the model's embedding must hold every id)"
        )
    config_path = path.parent / CONFIG_FILE
    config: dict = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as e:
            fail(f"its {CONFIG_FILE} beside it is not readable JSON ({e}); fix or remove it")
    bos, eos = _framing(tokenizer, config if isinstance(config, dict) else {})
    return TextEncoder(path=str(path), digest=_digest(path, config_path), vocab_size=size, bos=bos, eos=eos)
