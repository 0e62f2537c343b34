"""Documents of a Hugging Face dataset on disk, read through the ``datasets`` library.

``data.path`` names one of

- a dataset saved with ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (a folder with
  ``state.json`` or ``dataset_dict.json``; of a ``DatasetDict`` the ``train`` split, or its only one);
- a ``.parquet``, ``.jsonl`` / ``.json`` (JSON Lines) or ``.arrow`` file;
- a folder of such files, all of one format (a dataset's shards as the Hub serves them),
  read in the order of their paths.

Each row's ``data.text_column`` is one document. Files are streamed (``streaming=True``): rows
are read in batches straight from the files, with no copy into ``datasets``' own cache, and
nothing is downloaded (``HF_HUB_OFFLINE``). What cannot be read (not that format, a missing
column, a column that is not text, no text at all) is one line naming the fix
(:class:`~monarch_ft.records.errors.ConfigError`), before anything is launched.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from monarch_ft.records.errors import ConfigError

# File suffix -> the ``datasets`` packaged builder that reads it.
DATASET_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
# What Dataset(Dict).save_to_disk writes at the top of its folder.
SAVED_MARKERS = ("state.json", "dataset_dict.json")
# Rows per batch handed to the tokenizer (encoded in parallel by tokenizers).
BATCH_ROWS = 1024


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset's rows come from.

    Args:
        shown: ``data.path`` as the user gave it (for messages).
        root: its resolved path.
        files: every file whose content the rows come from (the cache key hashes them).
        builder: the ``datasets`` builder for the files; None: a folder saved by ``save_to_disk``.
    """

    shown: str
    root: Path
    files: tuple[Path, ...]
    builder: Optional[str]

    def fail(self, problem: str) -> None:
        raise ConfigError(f"data.path={self.shown}: {problem}")

    @property
    def kind(self) -> str:
        return "dataset saved with save_to_disk" if self.builder is None else f"{self.builder} dataset"


def find_dataset(path: Path, shown: str) -> Optional[DatasetSource]:
    """The dataset at ``path``, or None when ``path`` is a file of another kind (text, token ids).

    Raises:
        ConfigError: a folder that holds no dataset, or files of several formats.
    """
    if path.is_file():
        builder = DATASET_SUFFIXES.get(path.suffix.lower())
        return DatasetSource(shown, path, (path,), builder) if builder else None
    if not path.is_dir():
        return None
    if any((path / m).is_file() for m in SAVED_MARKERS):
        return DatasetSource(shown, path, tuple(sorted(p for p in path.rglob("*") if p.is_file())), None)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATASET_SUFFIXES)
    builders = sorted({DATASET_SUFFIXES[p.suffix.lower()] for p in files})
    if not files:
        raise ConfigError(
            f"data.path={shown}: is a folder with no dataset in it: give a dataset saved with save_to_disk, "
            f"or a folder or file of {', '.join(DATASET_SUFFIXES)} files"
        )
    if len(builders) > 1:
        raise ConfigError(f"data.path={shown}: holds files of several formats ({', '.join(builders)}); give a folder of one format, or one file")
    return DatasetSource(shown, path, tuple(files), builders[0])


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _quiet_datasets():
    """``datasets``, offline and silent: its log lines and progress bars would duplicate the one
    line a problem gets here."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(logging.CRITICAL + 1)
    return datasets


def _open(src: DatasetSource, column: str):
    """The rows of ``src`` (a Dataset or a streaming IterableDataset) and its column names, if known."""
    datasets = _quiet_datasets()
    try:
        if src.builder is None:
            ds = datasets.load_from_disk(str(src.root))
            if isinstance(ds, datasets.DatasetDict):
                splits = list(ds)
                if "train" not in ds and len(splits) != 1:
                    src.fail(f"is a DatasetDict with splits {', '.join(splits)} and no train split; save the split to train on alone")
                ds = ds["train"] if "train" in ds else ds[splits[0]]
        else:
            ds = datasets.load_dataset(src.builder, data_files=[str(f) for f in src.files], split="train", streaming=True)
    except ConfigError:
        raise
    except Exception as e:
        src.fail(f"is not a readable {src.kind} ({_first_line(e)})")
    return ds, ds.column_names


def _missing_column(src: DatasetSource, column: str, names) -> None:
    src.fail(f"has no column {column!r} (its columns: {', '.join(names)}): set data.text_column to the one holding the text")


def documents(src: DatasetSource, column: str) -> Iterator[list[str]]:
    """The documents of ``src`` in batches of up to :data:`BATCH_ROWS` (rows with no text skipped).

    Args:
        src: the dataset (:func:`find_dataset`).
        column: ``data.text_column``.

    Raises:
        ConfigError: unreadable, no such column, a column that is not text, no text at all.
    """
    ds, names = _open(src, column)
    if names is not None and column not in names:
        _missing_column(src, column, names)
    if names is not None:
        ds = ds.select_columns([column])
    rows = iter(ds.iter(batch_size=BATCH_ROWS))
    seen_text = False
    while True:
        try:
            batch = next(rows)
        except StopIteration:
            break
        except Exception as e:
            src.fail(f"is not a readable {src.kind} ({_first_line(e)})")
        if column not in batch:
            _missing_column(src, column, list(batch))
        texts = batch[column]
        wrong = next((t for t in texts if t is not None and not isinstance(t, str)), None)
        if wrong is not None:
            src.fail(f"column {column!r} holds {type(wrong).__name__} values, not text: set data.text_column to the column holding the text")
        texts = [t for t in texts if t]
        seen_text = seen_text or bool(texts)
        if texts:
            yield texts
    if not seen_text:
        src.fail(f"holds no text in column {column!r} (no rows, or every one empty)")
