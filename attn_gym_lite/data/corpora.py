"""Corpora: iterators of document strings in a fixed order (a resumable loader takes a function
returning one, e.g. ``functools.partial(jsonl_texts, "data.jsonl")``)."""

from __future__ import annotations

import itertools
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

__all__ = ["python_stdlib_corpus", "text_files", "jsonl_texts", "parquet_texts", "hf_dataset_texts"]

# Left out of the stdlib corpus: third-party packages and the stdlib's own test suites, which are
# large, repetitive and absent from many distributions' Python builds.
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def python_stdlib_corpus(limit: int | None = None) -> Iterator[str]:
    """The running Python's standard library, one ``.py`` file per document in sorted path order
    (no test suites, third-party packages, non-UTF-8 or blank files): real code, offline on every
    machine (CPython 3.11: 731 files, about 12 MB). At most ``limit`` documents."""
    root = Path(sysconfig.get_paths()["stdlib"])
    relative_paths = []
    for folder, subfolders, files in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages (often much larger than the stdlib).
        subfolders[:] = [name for name in subfolders if name not in _STDLIB_SKIPPED_DIRS]
        relative_folder = Path(folder).relative_to(root)
        relative_paths += [relative_folder / name for name in files if name.endswith(".py")]
    paths = [root / path for path in sorted(relative_paths, key=Path.as_posix)]

    def documents() -> Iterator[str]:
        for path in paths:
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                yield text

    return itertools.islice(documents(), limit)


def text_files(folder: str | os.PathLike[str]) -> Iterator[str]:
    """Each ``*.txt`` file under ``folder`` (recursively, sorted), read as UTF-8."""
    root = Path(folder)
    paths = sorted((path for path in root.glob("**/*.txt") if path.is_file()),
                   key=lambda path: path.relative_to(root).as_posix())
    for path in paths:
        yield path.read_text(encoding="utf-8-sig")


def jsonl_texts(path: str | os.PathLike[str], field: str = "text") -> Iterator[str]:
    """``record[field]`` of each record of a JSON Lines file; blank lines and nulls skipped."""
    with open(path, encoding="utf-8-sig") as file:
        for line in file:
            if line.strip() and (text := json.loads(line)[field]) is not None:
                yield text


def parquet_texts(path: str | os.PathLike[str], column: str = "text") -> Iterator[str]:
    """The non-null values of a string (or categorical) column of a Parquet file, streamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet_file:
        for record_batch in parquet_file.iter_batches(batch_size=1024, columns=[column]):
            values = record_batch.column(0)
            if pa.types.is_dictionary(values.type):
                values = values.dictionary_decode()
            yield from (text for text in values.to_pylist() if text is not None)


def hf_dataset_texts(path: str, name: str | None = None, *, split: str = "train", field: str = "text",
                     **load_kwargs: object) -> Iterator[str]:
    """``record[field]`` streamed from ``datasets.load_dataset(path, name, split=split,
    streaming=True, **load_kwargs)``, e.g. ``("HuggingFaceFW/fineweb", "sample-10BT")`` online or
    ``("json", data_files="my.jsonl")`` offline; null fields skipped."""
    import datasets

    for record in datasets.load_dataset(path, name, split=split, streaming=True, **load_kwargs):
        if record[field] is not None:
            yield record[field]
