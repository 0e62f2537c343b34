"""Training data that needs no download: the Python standard library's own sources,
or a file of the user's own (``data.path``).

The supervisor (single controller) prepares the data once before any rank starts:
it gathers a deterministic corpus of stdlib ``.py`` files, trains a byte-level BPE
tokenizer on it with the ``tokenizers`` package, and writes the token ids to a flat
``uint16`` file. Ranks only memory-map that file, so a restarted rank starts fast
and every rank sees the same tokens.

Batches are a pure function of ``(seed, step, group, rank)``: a rank needs no data
loader state to resume, and a group healed to step ``s`` reads exactly what a
fault-free run would have read at ``s``.

``data.path`` names a file on the controller's disk (and, for ranks on other hosts, the
same path on theirs). By its suffix it is either

- text (``.txt``, ``.md``, ``.rst``, ``.py``): encoded with the project's tokenizer (the
  one trained on the stdlib corpus, so ``model.vocab_size`` holds every id) and cached
  like the stdlib corpus, keyed by the file's content; or
- token ids already made (the ranks read the file itself, nothing is copied):
  ``.npy`` (a 1-D integer NumPy array, any integer dtype), ``.bin`` or ``.u16`` (raw
  little-endian ``uint16``, nanoGPT's ``train.bin``), ``.u32`` (raw little-endian ``uint32``).

A file that is missing, empty, of another format, too short for one sequence, or holding
an id the model's embedding lacks (``>= model.vocab_size``) is refused on the controller
with one line (:class:`~monarch_ft.records.errors.ConfigError`) before anything is launched: a
rank would otherwise fail on its first batch, or index its embedding out of range, in
every group and on every restart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monarch_ft.paths import IS_CHECKOUT, REPO_ROOT
from monarch_ft.records.errors import ConfigError

_FORMAT_VERSION = 1

# data.path formats, by suffix: raw token files (dtype) and text the project's tokenizer encodes.
RAW_TOKEN_DTYPES = {".bin": np.dtype("<u2"), ".u16": np.dtype("<u2"), ".u32": np.dtype("<u4")}
TOKEN_SUFFIXES = (".npy", *RAW_TOKEN_DTYPES)
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
# Text is encoded in pieces of about this many characters, cut at a line end.
_TEXT_CHUNK = 1 << 20


@dataclass(frozen=True)
class PreparedData:
    tokens_path: str
    tokenizer_path: str
    vocab_size: int
    num_tokens: int


@functools.lru_cache(maxsize=4)
def _stdlib_files(max_bytes: int) -> tuple[Path, ...]:
    """A sorted, deterministic selection of stdlib sources (tests and site-packages left out).

    Remembered per process: walking the stdlib takes most of a second, and a controller may
    prepare the data more than once (a drill and its baseline, the text of data.path)."""
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
    return tuple(files)


def default_cache_dir() -> Path:
    """``data.cache_dir`` unset: a checkout's ``.cache/monarch_ft``; an installed package's
    ``$XDG_CACHE_HOME/monarch_ft`` (``~/.cache/monarch_ft``), never the install's own directory."""
    if IS_CHECKOUT:
        return Path(REPO_ROOT) / ".cache" / "monarch_ft"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "monarch_ft"


def prepare(cache_dir: str | os.PathLike | None, vocab_size: int, max_corpus_mb: float) -> PreparedData:
    """Build (or reuse) the tokenizer and the token file; safe to call repeatedly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = _stdlib_files(int(max_corpus_mb * 1024 * 1024))
    if not files:
        raise RuntimeError(f"no standard-library sources found under {sysconfig.get_paths()['stdlib']}")
    key = hashlib.sha256(json.dumps([_FORMAT_VERSION, vocab_size, sys.version, [str(f) for f in files]]).encode()).hexdigest()[:16]
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


def open_tokens(path: str | os.PathLike) -> np.ndarray:
    """The token ids of a token file, memory-mapped; its format is its suffix (see the module doc;
    the cache's own files are ``.u16``)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    return np.memmap(path, dtype=RAW_TOKEN_DTYPES.get(suffix, np.dtype("<u2")), mode="r")


def _fail(path: str, problem: str) -> None:
    raise ConfigError(f"data.path={path}: {problem}")


def _check_tokens(path: str, tokens: np.ndarray, vocab_size: int, seq_len: int) -> int:
    """Refuse a token array the model cannot train on; returns its length."""
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        _fail(path, f"holds a {tokens.ndim}-D {tokens.dtype} array; save the token ids as one 1-D integer array")
    if tokens.size <= seq_len + 1:
        _fail(path, f"has {tokens.size} tokens; training.seq_len={seq_len} needs more than {seq_len + 1}: use a longer file or a shorter training.seq_len")
    # In pieces: a memory-mapped file of many GB is never loaded whole.
    low, high = 0, 0
    for start in range(0, tokens.size, 1 << 26):
        piece = tokens[start : start + (1 << 26)]
        low, high = min(low, int(piece.min())), max(high, int(piece.max()))
    if low < 0:
        _fail(path, f"holds a negative token id ({low}); token ids are indices into the model's vocabulary")
    if high >= vocab_size:
        _fail(
            path,
            f"holds token id {high}, beyond model.vocab_size={vocab_size}: set model.vocab_size={high + 1} or more, "
            "or use a file tokenised for this vocabulary",
        )
    return int(tokens.size)


def _encode_text(path: Path, tokenizer_path: str, cache_dir: Path) -> tuple[str, int]:
    """Encode a text file with the project's tokenizer into the cache (once per content)."""
    from tokenizers import Tokenizer

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    key = hashlib.sha256(json.dumps([_FORMAT_VERSION, tokenizer_path, digest.hexdigest()]).encode()).hexdigest()[:16]
    out = cache_dir / f"text-{path.stem[:40]}-{key}"
    tokens_path = out / "tokens.u16"
    if tokens_path.exists():
        return str(tokens_path), int(tokens_path.stat().st_size // 2)
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        _fail(str(path), "holds no text (only whitespace); give a file with some text in it")
    # Pieces cut at line ends (encoded in parallel by tokenizers); one end-of-text after the file.
    chunks, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _TEXT_CHUNK)
        end = len(text) if end < 0 else end + 1
        chunks.append(text[start:end])
        start = end
    tokenizer = Tokenizer.from_file(tokenizer_path)
    ids = [i for enc in tokenizer.encode_batch(chunks) for i in enc.ids]
    ids.append(tokenizer.token_to_id("<|eos|>"))
    tokens = np.asarray(ids, dtype=np.uint16)
    out.mkdir(parents=True, exist_ok=True)
    # A temporary name and a rename: a crash never leaves a half-written cache.
    tokens.tofile(str(tokens_path) + f".tmp.{os.getpid()}")
    os.replace(str(tokens_path) + f".tmp.{os.getpid()}", tokens_path)
    return str(tokens_path), int(tokens.size)


def prepare_data(cfg, vocab_size: int, seq_len: int) -> PreparedData:
    """The token file a job trains on: the stdlib corpus (``data.path`` unset) or the user's file.

    Args:
        cfg: the job's ``DataConfig``.
        vocab_size: ``model.vocab_size``; every token id must be below it.
        seq_len: ``training.seq_len``; the file must hold more than one sequence.

    Raises:
        ConfigError: the user's file cannot be trained on (one line naming the fix).
    """
    if not cfg.path:
        return prepare(cfg.cache_dir, vocab_size, cfg.max_corpus_mb)
    shown = cfg.path
    path = Path(os.path.expanduser(cfg.path)).resolve()
    suffix = path.suffix.lower()
    if not path.exists():
        _fail(shown, "no such file; give the path of a text or token file on this machine")
    if not path.is_file():
        _fail(shown, "is not a file; give a text or token file")
    if suffix not in TOKEN_SUFFIXES + TEXT_SUFFIXES:
        _fail(
            shown,
            f"unknown format {suffix or '(no suffix)'!r}: text is {', '.join(TEXT_SUFFIXES)} (tokenised here), "
            f"token ids are .npy (1-D integers), .bin/.u16 (raw uint16) or .u32 (raw uint32)",
        )
    if path.stat().st_size == 0:
        _fail(shown, "is empty")
    if suffix in TEXT_SUFFIXES:
        # The project's tokenizer, trained on the stdlib corpus (cached), encodes the file.
        base = prepare(cfg.cache_dir, vocab_size, cfg.max_corpus_mb)
        tokens_path, _ = _encode_text(path, base.tokenizer_path, Path(cfg.cache_dir or default_cache_dir()))
        num = _check_tokens(shown, open_tokens(tokens_path), vocab_size, seq_len)
        return PreparedData(tokens_path=tokens_path, tokenizer_path=base.tokenizer_path, vocab_size=base.vocab_size, num_tokens=num)
    if suffix in RAW_TOKEN_DTYPES and path.stat().st_size % RAW_TOKEN_DTYPES[suffix].itemsize:
        _fail(shown, f"is {path.stat().st_size} bytes, not a whole number of {RAW_TOKEN_DTYPES[suffix]} token ids; is it really {suffix}?")
    try:
        tokens = open_tokens(path)
    except (ValueError, OSError) as e:
        _fail(shown, f"is not a readable {suffix} token file ({e})")
    num = _check_tokens(shown, tokens, vocab_size, seq_len)
    return PreparedData(tokens_path=str(path), tokenizer_path="", vocab_size=vocab_size, num_tokens=num)


class TokenBatches:
    """Random windows of the token file, chosen by ``(seed, step, group, rank)`` alone."""

    def __init__(self, tokens_path: str, batch_size: int, seq_len: int, seed: int) -> None:
        self.tokens = open_tokens(tokens_path)
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
