"""data.path: a user's own text or token file, checked on the controller before anything starts."""

from __future__ import annotations

import numpy as np
import pytest

from monarch_ft.common.data import TokenBatches, open_tokens, prepare_data
from monarch_ft.config.data import DataConfig
from monarch_ft.records.errors import ConfigError

VOCAB, SEQ = 2048, 16


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module: the tokenizer (on a small stdlib corpus) is trained once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def _cfg(cache):
    return lambda tmp_path, path: DataConfig(path=str(path) if path is not None else None, cache_dir=str(cache), max_corpus_mb=0.1)


@pytest.mark.parametrize(
    "name, write",
    [
        ("tokens.npy", lambda p, ids: np.save(p, ids.astype(np.int32))),
        ("train.bin", lambda p, ids: ids.astype("<u2").tofile(p)),
        ("tokens.u16", lambda p, ids: ids.astype("<u2").tofile(p)),
        ("tokens.u32", lambda p, ids: ids.astype("<u4").tofile(p)),
    ],
)
def test_token_files_are_read_as_they_are(tmp_path, _cfg, name, write):
    ids = np.arange(1000) % VOCAB
    path = tmp_path / name
    write(path, ids)
    data = prepare_data(_cfg(tmp_path, path), VOCAB, SEQ)
    assert data.tokens_path == str(path) and data.num_tokens == 1000
    assert np.array_equal(np.asarray(open_tokens(data.tokens_path)), ids)
    # What a rank reads: windows of the file itself, a pure function of (seed, step, group, rank).
    batches = TokenBatches(data.tokens_path, 2, SEQ, seed=0)
    inputs, labels = batches.batch(3, 1, 0)
    assert inputs.shape == (2, SEQ) and bool((labels[:, :-1] == inputs[:, 1:]).all())
    assert bool(((labels - inputs) % VOCAB == 1).all())  # consecutive ids: the window is contiguous
    assert np.array_equal(batches.batch(3, 1, 0)[0].numpy(), inputs.numpy())


def test_text_is_tokenised_with_the_project_tokenizer_and_cached(tmp_path, _cfg):
    from tokenizers import Tokenizer

    text = "def greet(name):\n    return f'hello {name}'\n\n" * 40
    path = tmp_path / "mine.txt"
    path.write_text(text)
    cfg = _cfg(tmp_path, path)
    data = prepare_data(cfg, VOCAB, SEQ)
    stdlib = prepare_data(_cfg(tmp_path, None), VOCAB, SEQ)
    assert data.tokenizer_path == stdlib.tokenizer_path, "the text is encoded by the tokenizer the stdlib corpus trained"
    ids = open_tokens(data.tokens_path)
    tokenizer = Tokenizer.from_file(data.tokenizer_path)
    assert ids[-1] == tokenizer.token_to_id("<|eos|>")
    assert tokenizer.decode(list(map(int, ids[:-1]))) == text
    assert int(ids.max()) < VOCAB and data.num_tokens == ids.size
    mtime = (tmp_path / data.tokens_path).stat().st_mtime_ns
    assert prepare_data(cfg, VOCAB, SEQ).tokens_path == data.tokens_path
    assert (tmp_path / data.tokens_path).stat().st_mtime_ns == mtime, "a second job reuses the cache"
    path.write_text(text + "x = 1\n")
    assert prepare_data(cfg, VOCAB, SEQ).tokens_path != data.tokens_path, "edited text is encoded again"


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, np.ndarray) and path.suffix == ".npy":
        np.save(path, content)
    elif isinstance(content, np.ndarray):
        content.tofile(path)
    else:
        path.write_text(content)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("missing.npy", None, "missing.npy: no such file"),
        ("empty.bin", b"", "empty.bin: is empty"),
        ("blank.txt", " \n\n", "blank.txt: holds no text"),
        ("data.csv", "1,2,3\n", "unknown format '.csv'"),
        ("noext", "text\n", "unknown format '(no suffix)'"),
        ("odd.u32", b"\x00" * 10, "is 10 bytes, not a whole number of uint32 token ids"),
        ("short.u16", np.arange(SEQ, dtype="<u2"), f"has {SEQ} tokens; training.seq_len={SEQ} needs more than {SEQ + 1}"),
        ("big.u32", np.array([5] * 100 + [70000], dtype="<u4"), f"holds token id 70000, beyond model.vocab_size={VOCAB}: set model.vocab_size=70001"),
        ("neg.npy", np.array([1, -3] * 50, dtype=np.int64), "holds a negative token id (-3)"),
        ("twod.npy", np.zeros((50, 4), dtype=np.int64), "holds a 2-D int64 array; save the token ids as one 1-D integer array"),
        ("float.npy", np.zeros(100, dtype=np.float32), "1-D float32 array"),
        ("pickled.npy", np.array([{"a": 1}] * 100, dtype=object), "is not a readable .npy token file"),
        ("garbage.npy", b"not numpy at all", "is not a readable .npy token file"),
    ],
)
def test_a_file_that_cannot_be_trained_on_is_one_config_error(tmp_path, _cfg, name, content, expected):
    path = tmp_path / name
    if content is not None:
        _write(path, content)
    with pytest.raises(ConfigError) as e:
        prepare_data(_cfg(tmp_path, path), VOCAB, SEQ)
    message = str(e.value)
    assert message.startswith(f"data.path={path}") and expected in message and "\n" not in message, message


def test_a_folder_without_a_dataset_is_not_data(tmp_path, _cfg):
    """A folder is data only as a Hugging Face dataset (tests/unit/test_user_data.py)."""
    with pytest.raises(ConfigError, match="is a folder with no dataset in it"):
        prepare_data(_cfg(tmp_path, tmp_path), VOCAB, SEQ)
