"""Training data that needs no download: the Python standard library's own sources.

The supervisor (single controller) prepares the data once before any rank starts:
it gathers a deterministic corpus of stdlib ``.py`` files, trains a byte-level BPE
tokenizer on it with the ``tokenizers`` package, and writes the token ids to a flat
``uint16`` file. Ranks only memory-map that file, so a restarted rank starts fast
and every rank sees the same tokens.

Batches are a pure function of ``(seed, step, group, rank)``: a rank needs no data
loader state to resume, and a group healed to step ``s`` reads exactly what a
fault-free run would have read at ``s``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PreparedData:
    tokens_path: str
    tokenizer_path: str
    vocab_size: int
    num_tokens: int


def _stdlib_files(max_bytes: int) -> list[Path]:
    """A sorted, deterministic selection of stdlib sources (tests and site-packages left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if skip.intersection(path.relative_to(root).parts):
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        files.append(path)
        total += size
    return files


def default_cache_dir() -> Path:
    return REPO_ROOT / ".cache" / "monarch_ft"


def prepare(cache_dir: str | os.PathLike | None, vocab_size: int, max_corpus_mb: float) -> PreparedData:
    """Build (or reuse) the tokenizer and the token file; safe to call repeatedly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = _stdlib_files(int(max_corpus_mb * 1024 * 1024))
    if not files:
        raise RuntimeError(f"no standard-library sources found under {sysconfig.get_paths()['stdlib']}")
    key = hashlib.sha256(
        json.dumps([_FORMAT_VERSION, vocab_size, sys.version, [str(f) for f in files]]).encode()
    ).hexdigest()[:16]
    out = Path(cache_dir or default_cache_dir()) / f"stdlib-v{vocab_size}-{key}"
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return PreparedData(**meta)

    out.mkdir(parents=True, exist_ok=True)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos = tokenizer.token_to_id("<|eos|>")
    ids: list[int] = []
    for enc in tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    if tokenizer.get_vocab_size() > np.iinfo(np.uint16).max:
        raise RuntimeError(f"vocab_size={vocab_size} does not fit the uint16 token file")
    tokens = np.asarray(ids, dtype=np.uint16)

    # Write to temporary names and rename: a crash never leaves a half-written cache.
    tok_path, tokens_path = out / "tokenizer.json", out / "tokens.u16"
    tokenizer.save(str(tok_path) + ".tmp")
    os.replace(str(tok_path) + ".tmp", tok_path)
    tokens.tofile(str(tokens_path) + ".tmp")
    os.replace(str(tokens_path) + ".tmp", tokens_path)
    data = PreparedData(
        tokens_path=str(tokens_path),
        tokenizer_path=str(tok_path),
        vocab_size=tokenizer.get_vocab_size(),
        num_tokens=int(tokens.size),
    )
    meta_path.with_suffix(".tmp").write_text(json.dumps(data.__dict__))
    os.replace(meta_path.with_suffix(".tmp"), meta_path)
    return data


class TokenBatches:
    """Random windows of the token file, chosen by ``(seed, step, group, rank)`` alone."""

    def __init__(self, tokens_path: str, batch_size: int, seq_len: int, seed: int) -> None:
        self.tokens = np.memmap(tokens_path, dtype=np.uint16, mode="r")
        if self.tokens.size <= seq_len + 1:
            raise ValueError(f"token file {tokens_path} has {self.tokens.size} tokens, need > {seq_len + 1}")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed

    def batch(self, step: int, group: int, rank: int):
        import torch

        rng = np.random.default_rng([self.seed, step, group, rank])
        starts = rng.integers(0, self.tokens.size - self.seq_len - 1, size=self.batch_size)
        window = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        window = torch.from_numpy(window)
        return window[:, :-1], window[:, 1:]
