"""Training data that needs no download: the Python standard library's own sources,
or data of the user's own (``data.path``), encoded by the project's tokenizer or the user's
(``data.tokenizer``).

The supervisor (single controller) prepares the data once before any rank starts:
it gathers a deterministic corpus of stdlib ``.py`` files, trains a byte-level BPE
tokenizer on it with the ``tokenizers`` package, and writes the token ids to a flat
``uint16`` file. Ranks only memory-map that file, so a restarted rank starts fast
and every rank sees the same tokens.

Batches are a pure function of ``(seed, step, group, rank)``: a rank needs no data
loader state to resume, and a group healed to step ``s`` reads exactly what a
fault-free run would have read at ``s``.

``data.path`` names a file or folder on the controller's disk (and, for ranks on other hosts,
the same path on theirs). It is either

- text (``.txt``, ``.md``, ``.rst``, ``.py``): one document, encoded and cached like the
  stdlib corpus, keyed by the file's content and the tokenizer's;
- a Hugging Face dataset on disk (a folder saved by ``save_to_disk``; ``.parquet``,
  ``.jsonl``/``.json``, ``.arrow`` files, or a folder of them): each row's ``data.text_column``
  one document, read through the ``datasets`` library (monarch_ft/common/text_datasets.py),
  encoded and cached the same way; or
- token ids already made (the ranks read the file itself, nothing is copied):
  ``.npy`` (a 1-D integer NumPy array, any integer dtype), ``.bin`` or ``.u16`` (raw
  little-endian ``uint16``, nanoGPT's ``train.bin``), ``.u32`` (raw little-endian ``uint32``).

Text is encoded by ``data.tokenizer`` when given (any Hugging Face ``tokenizers`` file,
checked against ``model.vocab_size``; its framing of documents: monarch_ft/common/encoder.py),
else by the project's tokenizer (trained on the stdlib corpus, so ``model.vocab_size`` holds
every id). The cached ids are ``uint16``, or ``uint32`` for a vocabulary beyond 65536.

A file that is missing, empty, of another format, too short for one sequence, or holding
an id the model's embedding lacks (``>= model.vocab_size``), a dataset without the text column,
or a tokenizer whose vocabulary exceeds the model, is refused on the controller with one line
(:class:`~monarch_ft.records.errors.ConfigError`) before anything is launched: a rank would
otherwise fail on its first batch, or index its embedding out of range, in every group and on
every restart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from monarch_ft.common.encoder import TextEncoder, project_encoder, user_encoder
from monarch_ft.common.text_datasets import DATASET_SUFFIXES, DatasetSource, documents, find_dataset
from monarch_ft.paths import IS_CHECKOUT, REPO_ROOT
from monarch_ft.records.errors import ConfigError

_FORMAT_VERSION = 2

# data.path formats, by suffix: raw token files (dtype) and text the project's tokenizer encodes.
RAW_TOKEN_DTYPES = {".bin": np.dtype("<u2"), ".u16": np.dtype("<u2"), ".u32": np.dtype("<u4")}
TOKEN_SUFFIXES = (".npy", *RAW_TOKEN_DTYPES)
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
# Text is encoded in pieces of about this many characters, cut at a line end.
_TEXT_CHUNK = 1 << 20
# Seconds between two progress lines while a large input is tokenised.
_PROGRESS_S = 10.0


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


def _content_key(*parts: object, files: Iterable[Path] = ()) -> str:
    """A cache key: ``parts`` and the content of ``files`` (an edited input is encoded again)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return hashlib.sha256(json.dumps([_FORMAT_VERSION, *map(str, parts), digest.hexdigest()]).encode()).hexdigest()[:16]


def _encode_to_cache(out: Path, encoder: TextEncoder, batches: Callable[[object], Iterable[list[int]]], shown: str) -> tuple[str, int]:
    """The token file of ``out`` (once per key): ``batches(tokenizer)``'s ids written as they come,
    so an input of many GB is never held whole; a progress line every few seconds.

    Args:
        out: the cache folder of this input and tokenizer (its name holds the key).
        encoder: the tokenizer and its framing; its ``dtype`` names the file (``.u16``/``.u32``).
        batches: given the loaded tokenizer, the ids in pieces.
        shown: the input as the user named it (for the progress line).
    """
    tokens_path = out / ("tokens.u16" if encoder.dtype.itemsize == 2 else "tokens.u32")
    if tokens_path.exists():
        return str(tokens_path), int(tokens_path.stat().st_size // encoder.dtype.itemsize)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{tokens_path}.tmp.{os.getpid()}")
    count, started, shown_at = 0, time.time(), time.time()
    try:
        with open(tmp, "wb") as f:
            for ids in batches(encoder.load()):
                np.asarray(ids, dtype=encoder.dtype).tofile(f)
                count += len(ids)
                if time.time() - shown_at > _PROGRESS_S:
                    shown_at = time.time()
                    print(f"monarch_ft: tokenising {shown}: {count:,} tokens in {shown_at - started:.0f} s", file=sys.stderr, flush=True)
        # A temporary name and a rename: a crash never leaves a half-written cache.
        os.replace(tmp, tokens_path)
    finally:
        tmp.unlink(missing_ok=True)
    return str(tokens_path), count


def _text_pieces(text: str) -> list[str]:
    """Pieces cut at line ends (encoded in parallel by tokenizers)."""
    chunks, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _TEXT_CHUNK)
        end = len(text) if end < 0 else end + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def _encode_text(path: Path, encoder: TextEncoder, cache_dir: Path) -> tuple[str, int]:
    """Encode a text file, one document, into the cache (once per content and tokenizer)."""
    out = cache_dir / f"text-{path.stem[:40]}-{_content_key(encoder.digest, files=[path])}"
    text: Optional[str] = None
    if not any(out.glob("tokens.u*")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            _fail(str(path), "holds no text (only whitespace); give a file with some text in it")
    return _encode_to_cache(out, encoder, lambda tok: [encoder.encode_pieces(tok, _text_pieces(text or ""))], str(path))


def _encode_dataset(src: DatasetSource, column: str, encoder: TextEncoder, cache_dir: Path) -> tuple[str, int]:
    """Encode a dataset's documents into the cache (once per content, column and tokenizer)."""
    out = cache_dir / f"dataset-{src.root.stem[:40]}-{_content_key(encoder.digest, column, files=src.files)}"
    return _encode_to_cache(out, encoder, lambda tok: (encoder.encode_documents(tok, texts) for texts in documents(src, column)), src.shown)


def _encode_stdlib(cfg, encoder: TextEncoder) -> tuple[str, int]:
    """The stdlib corpus encoded by the user's tokenizer (each source file a document)."""
    files = _stdlib_files(int(cfg.max_corpus_mb * 1024 * 1024))
    out = Path(cfg.cache_dir or default_cache_dir()) / f"stdlib-tok-{_content_key(encoder.digest, sys.version, [str(f) for f in files])}"
    texts = lambda: [f.read_text(encoding="utf-8", errors="replace") for f in files]  # noqa: E731
    return _encode_to_cache(out, encoder, lambda tok: [encoder.encode_documents(tok, texts())], "the stdlib corpus")


def prepare_data(cfg, vocab_size: int, seq_len: int) -> PreparedData:
    """The token file a job trains on: the stdlib corpus (``data.path`` unset) or the user's data,
    encoded by the project's tokenizer or ``data.tokenizer``.

    Args:
        cfg: the job's ``DataConfig``.
        vocab_size: ``model.vocab_size``; every token id must be below it.
        seq_len: ``training.seq_len``; the file must hold more than one sequence.

    Raises:
        ConfigError: the user's data or tokenizer cannot be trained on (one line naming the fix).
    """
    # The tokenizer first: a vocabulary the model cannot hold is told before any data is read.
    encoder = user_encoder(cfg.tokenizer, vocab_size) if cfg.tokenizer else None
    cache_dir = Path(cfg.cache_dir or default_cache_dir())
    if not cfg.path:
        if encoder is None:
            return prepare(cfg.cache_dir, vocab_size, cfg.max_corpus_mb)
        tokens_path, _ = _encode_stdlib(cfg, encoder)
        num = _check_tokens("(the stdlib corpus)", open_tokens(tokens_path), vocab_size, seq_len)
        return PreparedData(tokens_path=tokens_path, tokenizer_path=encoder.path, vocab_size=encoder.vocab_size, num_tokens=num)
    shown = cfg.path
    path = Path(os.path.expanduser(cfg.path)).resolve()
    suffix = path.suffix.lower()
    if not path.exists():
        _fail(shown, "no such file; give the path of a text, dataset or token file on this machine")
    source = find_dataset(path, shown)
    if source is None and not path.is_file():
        _fail(shown, "is not a file; give a text or token file")
    if source is None and suffix not in TOKEN_SUFFIXES + TEXT_SUFFIXES:
        _fail(
            shown,
            f"unknown format {suffix or '(no suffix)'!r}: text is {', '.join(TEXT_SUFFIXES)} (tokenised here), "
            f"a dataset is {', '.join(DATASET_SUFFIXES)} or a folder saved by save_to_disk, "
            f"token ids are .npy (1-D integers), .bin/.u16 (raw uint16) or .u32 (raw uint32)",
        )
    if path.is_file() and path.stat().st_size == 0:
        _fail(shown, "is empty")
    if source is not None or suffix in TEXT_SUFFIXES:
        if encoder is None:
            # The project's tokenizer, trained on the stdlib corpus (cached), encodes the text.
            encoder = project_encoder(prepare(cfg.cache_dir, vocab_size, cfg.max_corpus_mb).tokenizer_path)
        if source is not None:
            tokens_path, _ = _encode_dataset(source, cfg.text_column, encoder, cache_dir)
        else:
            tokens_path, _ = _encode_text(path, encoder, cache_dir)
        num = _check_tokens(shown, open_tokens(tokens_path), vocab_size, seq_len)
        return PreparedData(tokens_path=tokens_path, tokenizer_path=encoder.path, vocab_size=encoder.vocab_size, num_tokens=num)
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
