"""data.tokenizer and a dataset data.path: a user's own Hugging Face tokenizer and dataset, made
here (monarch_ft.testing.user_data), tokenised once on the controller and cached; what cannot be
trained on is one line before launch."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from monarch_ft.common.data import TokenBatches, open_tokens, prepare_data
from monarch_ft.config.data import DataConfig
from monarch_ft.records.errors import ConfigError
from monarch_ft.testing.user_data import BOS, EOS, documents, make_tokenizer, write_parquet

VOCAB, SEQ = 2048, 16


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's tokenizer and their documents as a parquet file (made once for the module)."""
    root = tmp_path_factory.mktemp("user")
    docs = documents()
    return {"root": root, "docs": docs, "tokenizer": make_tokenizer(root / "tok", docs), "parquet": write_parquet(root / "train.parquet", docs)}


def _cfg(tmp_path, path, tokenizer, **kw) -> DataConfig:
    return DataConfig(path=str(path) if path else None, tokenizer=str(tokenizer) if tokenizer else None, cache_dir=str(tmp_path / "cache"), **kw)


def _framed(tokenizer_path, docs) -> list[int]:
    """What the token file must hold: each document between the tokenizer's BOS and EOS."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ids: list[int] = []
    for doc in docs:
        ids += [tok.token_to_id(BOS), *tok.encode(doc, add_special_tokens=False).ids, tok.token_to_id(EOS)]
    return ids


def test_parquet_with_the_users_tokenizer_is_tokenised_once_and_memory_mapped(tmp_path, user):
    cfg = _cfg(tmp_path, user["parquet"], user["tokenizer"])
    data = prepare_data(cfg, VOCAB, SEQ)
    ids = open_tokens(data.tokens_path)
    assert isinstance(ids, np.memmap) and ids.dtype == np.dtype("<u2")
    assert list(map(int, ids)) == _framed(user["tokenizer"], user["docs"]), "every row one document, BOS ... EOS, in order"
    assert data.tokenizer_path == str(user["tokenizer"]) and data.vocab_size == 400 and data.num_tokens == ids.size
    mtime = os.stat(data.tokens_path).st_mtime_ns
    assert prepare_data(cfg, VOCAB, SEQ).tokens_path == data.tokens_path
    assert os.stat(data.tokens_path).st_mtime_ns == mtime, "a second job reuses the cache"
    inputs, labels = TokenBatches(data.tokens_path, 2, SEQ, seed=0).batch(0, 0, 0)
    assert inputs.shape == (2, SEQ) and int(inputs.max()) < 400


def test_every_dataset_form_gives_the_same_tokens(tmp_path, user):
    import datasets

    docs = user["docs"]
    expected = _framed(user["tokenizer"], docs)
    ds = datasets.Dataset.from_dict({"body": docs, "n": list(range(len(docs)))})
    ds.to_json(str(tmp_path / "train.jsonl"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "saved_dict"))
    (tmp_path / "shards").mkdir()
    ds.select(range(100)).to_parquet(str(tmp_path / "shards" / "train-00000.parquet"))
    ds.select(range(100, len(docs))).to_parquet(str(tmp_path / "shards" / "train-00001.parquet"))
    for path in ("train.jsonl", "saved", "saved_dict", "shards"):
        data = prepare_data(_cfg(tmp_path, tmp_path / path, user["tokenizer"], text_column="body"), VOCAB, SEQ)
        assert list(map(int, open_tokens(data.tokens_path))) == expected, path


def test_tokenizer_config_names_the_end_of_text(tmp_path, user):
    """A tokenizer_config.json beside the file (as transformers saves it) says which token ends a document."""
    import shutil

    folder = tmp_path / "tok"
    shutil.copytree(user["tokenizer"].parent, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": BOS}, "bos_token": None}))
    data = prepare_data(_cfg(tmp_path, user["parquet"], folder), VOCAB, SEQ)
    from tokenizers import Tokenizer

    bos = Tokenizer.from_file(str(user["tokenizer"])).token_to_id(BOS)
    ids = list(map(int, open_tokens(data.tokens_path)))
    assert ids[-1] == bos and ids.count(bos) == 2 * len(user["docs"]), "BOS from the post-processor, EOS from the config"


def test_the_stdlib_corpus_and_text_files_take_the_users_tokenizer(tmp_path, user):
    text = tmp_path / "notes.txt"
    text.write_text("".join(user["docs"]))
    data = prepare_data(_cfg(tmp_path, text, user["tokenizer"]), VOCAB, SEQ)
    assert list(map(int, open_tokens(data.tokens_path))) == _framed(user["tokenizer"], ["".join(user["docs"])])
    stdlib = prepare_data(DataConfig(tokenizer=str(user["tokenizer"]), cache_dir=str(tmp_path / "cache"), max_corpus_mb=0.05), VOCAB, SEQ)
    assert stdlib.tokenizer_path == str(user["tokenizer"]) and int(open_tokens(stdlib.tokens_path).max()) < 400


def test_a_vocabulary_beyond_uint16_is_stored_as_uint32(tmp_path, user):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "def": 1, "return": 70_000, EOS: 70_001}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    data = prepare_data(_cfg(tmp_path, user["parquet"], tmp_path / "big.json"), 70_002, SEQ)
    ids = open_tokens(data.tokens_path)
    assert data.tokens_path.endswith(".u32") and ids.dtype == np.dtype("<u4") and int(ids.max()) == 70_001


def _bad_parquet(tmp_path, user):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    return tmp_path / "bad.parquet"


def _ints(tmp_path, user):
    import datasets

    datasets.Dataset.from_dict({"text": list(range(50))}).to_parquet(str(tmp_path / "ints.parquet"))
    return tmp_path / "ints.parquet"


def _empty(tmp_path, user):
    return write_parquet(tmp_path / "empty.parquet", ["", ""])


def _bad_jsonl(tmp_path, user):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json\n')
    return tmp_path / "bad.jsonl"


def _no_dataset(tmp_path, user):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "readme.md").write_text("hi")
    return tmp_path / "folder"


def _mixed(tmp_path, user):
    (tmp_path / "mixed").mkdir()
    write_parquet(tmp_path / "mixed" / "a.parquet", ["x"])
    (tmp_path / "mixed" / "b.jsonl").write_text('{"text": "y"}\n')
    return tmp_path / "mixed"


def _dict_without_train(tmp_path, user):
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"validation": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    return tmp_path / "dd"


@pytest.mark.parametrize(
    "make, column, expected",
    [
        (lambda tmp_path, user: user["parquet"], "body", "has no column 'body' (its columns: id, text): set data.text_column"),
        (lambda tmp_path, user: user["parquet"], "id", "column 'id' holds int values, not text"),
        (_ints, "text", "column 'text' holds int values, not text"),
        (_bad_parquet, "text", "is not a readable parquet dataset (ArrowInvalid: "),
        (_bad_jsonl, "text", "is not a readable json dataset ("),
        (_empty, "text", "holds no text in column 'text'"),
        (_no_dataset, "text", "is a folder with no dataset in it"),
        (_mixed, "text", "holds files of several formats (json, parquet)"),
        (_dict_without_train, "text", "is a DatasetDict with splits validation, test and no train split"),
    ],
)
def test_a_dataset_that_cannot_be_trained_on_is_one_config_error(tmp_path, user, make, column, expected):
    path = make(tmp_path, user)
    with pytest.raises(ConfigError) as e:
        prepare_data(_cfg(tmp_path, path, user["tokenizer"], text_column=column), VOCAB, SEQ)
    message = str(e.value)
    assert message.startswith(f"data.path={path}: ") and expected in message and "\n" not in message, message


@pytest.mark.parametrize(
    "make, vocab, expected",
    [
        (lambda tmp_path, user: tmp_path / "nope.json", VOCAB, "no such file; give the path of a Hugging Face tokenizer.json"),
        (lambda tmp_path, user: tmp_path, VOCAB, "is a folder without a tokenizer.json"),
        (lambda tmp_path, user: (tmp_path / "t.json", (tmp_path / "t.json").write_text("{oops"))[0], VOCAB, "is not a Hugging Face tokenizers file ("),
        (lambda tmp_path, user: user["tokenizer"], 256, "its vocabulary has ids up to 399, beyond model.vocab_size=256: set model.vocab_size=400 or more"),
        (lambda tmp_path, user: user["tokenizer"].parent, 399, "beyond model.vocab_size=399"),
    ],
)
def test_a_tokenizer_that_cannot_be_used_is_one_config_error(tmp_path, user, make, vocab, expected):
    tokenizer = make(tmp_path, user)
    with pytest.raises(ConfigError) as e:
        prepare_data(_cfg(tmp_path, user["parquet"], tokenizer), vocab, SEQ)
    message = str(e.value)
    assert message.startswith(f"data.tokenizer={tokenizer}: ") and expected in message and "\n" not in message, message
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("dataset-*")), "refused before any data is read"


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (DataConfig(path="ids.npy", tokenizer="tok.json"), "data.tokenizer=tok.json has no effect with the token file data.path=ids.npy"),
        (DataConfig(path="notes.txt", text_column="body"), "data.text_column=body has no effect without a dataset as data.path"),
        (DataConfig(text_column="body"), "data.text_column=body has no effect"),
        (DataConfig(path="train.parquet", text_column=""), "data.text_column is empty"),
    ],
)
def test_data_keys_that_would_do_nothing_are_refused(cfg, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        cfg.check()
