"""A user's own tokenizer and dataset, made on the spot (nothing is downloaded): what the tests of
``data.tokenizer`` and a dataset ``data.path`` train on.

The tokenizer is a byte-level BPE in the shape of Llama 3's: ``<|begin_of_text|>`` put before
every text by its post-processor, ``<|end_of_text|>`` in its vocabulary.
"""

from __future__ import annotations

from pathlib import Path

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def documents(n: int = 200) -> list[str]:
    """``n`` short, distinct documents of Python-like text."""
    return [f"def f{i}(x):\n    return x * {i} + {i % 7}  # document {i}\n" for i in range(n)]


def make_tokenizer(folder: Path, texts: list[str], vocab_size: int = 400) -> Path:
    """Train a byte-level BPE on ``texts`` and save it as ``folder/tokenizer.json``; returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_parquet(path: Path, texts: list[str], column: str = "text") -> Path:
    """``texts`` as a parquet file with the text in ``column`` and an id column beside it."""
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"id": list(range(len(texts))), column: texts}).to_parquet(str(path))
    return path
