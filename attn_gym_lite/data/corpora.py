"""Corpora: iterators of document strings in a fixed order.

* :func:`python_stdlib_corpus`: the running Python's standard library, the offline default;
* :func:`text_files`: a folder of text files, one file per document;
* :func:`jsonl_texts`, :func:`parquet_texts`: one field/column of a JSON Lines or Parquet file;
* :func:`hf_dataset_texts`: a Hugging Face ``datasets`` dataset, streamed (for readers who are
  online; it also streams local JSONL/Parquet files, which is how it is tested).

Each returns an iterator and checks its arguments when called. A loader that must restore its
position re-reads the corpus, so it takes a *function* returning such an iterator, e.g.
``functools.partial(jsonl_texts, "data.jsonl")``.
"""

from __future__ import annotations

import itertools
import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..checks import check_file, check_folder, check_int

__all__ = [
    "python_stdlib_corpus",
    "text_files",
    "jsonl_texts",
    "parquet_texts",
    "hf_dataset_texts",
]

# Directory names left out of the stdlib corpus: third-party packages and the stdlib's own test
# suites (test/, tests/, idlelib/idle_test, lib2to3/tests, ctypes/test, ...), which are large,
# repetitive and absent from many distributions' Python builds.
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def _stdlib_source_files() -> list[Path]:
    """The stdlib's ``.py`` files in sorted order of their path relative to the stdlib root."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library folder {str(root)!r} does not exist")
    relative_paths = []
    for folder, subfolders, files in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages (often much larger than the stdlib).
        subfolders[:] = [name for name in subfolders if name not in _STDLIB_SKIPPED_DIRS]
        relative_folder = Path(folder).relative_to(root)
        relative_paths += [relative_folder / name for name in files if name.endswith(".py")]
    return [root / path for path in sorted(relative_paths, key=Path.as_posix)]


def python_stdlib_corpus(limit: int | None = None) -> Iterator[str]:
    """Yield the source code of the running Python's standard library, one file per document.

    Files are the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` in sorted order of
    their relative path, skipping ``site-packages``/``dist-packages``, test folders (any folder
    named ``test``, ``tests`` or ``idle_test``), files that are not valid UTF-8 and empty
    (whitespace-only) files. It is real code, available offline on every machine; the exact
    documents depend on the Python version (CPython 3.11: 731 files, about 12 MB).

    Args:
        limit: yield at most this many documents (>= 0); None for all.

    Yields:
        Each file's text (str), exactly as stored.

    Raises:
        TypeError, ValueError: ``limit`` is not None or an int >= 0.
        FileNotFoundError: the stdlib folder does not exist (an unusual embedded Python).
    """
    if limit is not None:
        limit = check_int("limit", limit, minimum=0)
    paths = _stdlib_source_files()

    def documents() -> Iterator[str]:
        for path in paths:
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                yield text

    return itertools.islice(documents(), limit)



def resolve_corpus(corpus: Iterable[str] | None) -> Iterable[str]:
    """``corpus`` as an iterable of document strings, or :func:`python_stdlib_corpus` for ``None``.

    A list or tuple is checked now: it must hold at least one document, and every document must be
    a ``str``. Any other iterable is read lazily, so its documents are checked as they come.

    Raises:
        TypeError: ``corpus`` is a single string (a common slip: it would iterate characters), not
            iterable, or holds something other than strings (``corpus[i]`` named).
        ValueError: ``corpus`` is an empty list or tuple (it would yield no batch at all).
    """
    if corpus is None:
        return python_stdlib_corpus()
    if isinstance(corpus, (str, bytes)) or not isinstance(corpus, Iterable):
        raise TypeError(f"corpus must be an iterable of document strings, got {type(corpus).__name__}")
    if isinstance(corpus, (list, tuple)):
        if not corpus:
            raise ValueError("corpus must hold at least one document, got an empty sequence (no batch could be made)")
        for i, document in enumerate(corpus):
            _check_document(document, i)
        return corpus
    return (_check_document(document, i) for i, document in enumerate(corpus))


def _check_document(document: object, index: int) -> str:
    if not isinstance(document, str):
        raise TypeError(f"corpus[{index}] must be a document string, got {type(document).__name__}: {document!r:.60}")
    return document


def text_files(folder: str | os.PathLike[str], pattern: str = "**/*.txt") -> Iterator[str]:
    """Yield the text of each file under ``folder`` matching ``pattern``, one file per document.

    Files are read as UTF-8 in sorted order of their path relative to ``folder``; a leading
    UTF-8 byte order mark is dropped (it is not text).

    Args:
        folder: the folder to search.
        pattern: a relative :meth:`pathlib.Path.glob` pattern; the default ``**/*.txt`` also
            matches files directly in ``folder``.

    Yields:
        Each file's text (str).

    Raises:
        FileNotFoundError: ``folder`` does not exist or is a file (the message says which), or
            no file matches ``pattern``.
        ValueError: ``pattern`` is empty, absolute, has a ``..`` part (it would read files outside
            ``folder``) or is ``"."``; a file is not valid UTF-8 (when reached).
        TypeError: ``folder`` is not a path or ``pattern`` not a str.
    """
    root = check_folder("folder", folder)
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    # Inside folder only: ".." would climb out of it (the glob follows it). An empty pattern and
    # "." have no parts (pathlib drops "."): they would glob the folder itself, which pathlib
    # refuses with a bare IndexError on some versions. (A pattern that matches only folders,
    # "sub/", finds no file: FileNotFoundError below.)
    parts = Path(pattern).parts
    if not parts or Path(pattern).is_absolute() or ".." in parts:
        raise ValueError(f"pattern must be a non-empty relative glob pattern of files inside folder "
                         f"(no '..' part), got {pattern!r}")
    paths = sorted(
        (path for path in root.glob(pattern) if path.is_file()),
        key=lambda path: path.relative_to(root).as_posix(),
    )
    if not paths:
        raise FileNotFoundError(f"no file under folder={str(root)!r} matches pattern={pattern!r}")

    def documents() -> Iterator[str]:
        for path in paths:
            try:
                yield path.read_text(encoding="utf-8-sig")
            except UnicodeDecodeError as error:
                raise ValueError(f"{str(path)!r} is not valid UTF-8: {error}") from None

    return documents()


def _jsonl_records(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(line_number, parsed_value)`` for each non-blank line of a JSON Lines file (a
    leading UTF-8 byte order mark, as Windows tools write, is skipped)."""
    with path.open(encoding="utf-8-sig") as file:
        lines = enumerate(file, start=1)
        while True:
            try:
                line_number, line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as error:
                raise ValueError(f"path={str(path)!r} must be a UTF-8 JSON Lines file, but it is not UTF-8: {error}") from None
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{str(path)!r} line {line_number} is not JSON: {error}") from None


def _jsonl_text(path: Path, line_number: int, record: object, field: str) -> str | None:
    if not isinstance(record, dict) or field not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"field={field!r} is missing from line {line_number} of {str(path)!r} (found {found})"
        )
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise TypeError(
            f"field={field!r} on line {line_number} of {str(path)!r} must be a string, "
            f"got {type(text).__name__}"
        )
    return text


def jsonl_texts(path: str | os.PathLike[str], field: str = "text") -> Iterator[str]:
    """Yield ``record[field]`` for each record of a JSON Lines file, in file order.

    Blank lines and records whose field is ``null`` are skipped. The first record is checked
    when this is called, so a wrong ``field`` fails at once.

    Args:
        path: a ``.jsonl`` file (UTF-8, with or without a byte order mark; one JSON object per
            line).
        field: the key holding the document text.

    Yields:
        Each document (str).

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory (the message says which).
        ValueError: the file is not UTF-8, a record lacks ``field`` or a line is not JSON (later
            lines: when reached).
        TypeError: a record's ``field`` is neither a string nor null.
    """
    path = check_file("path", path)
    if not isinstance(field, str):
        raise TypeError(f"field must be a str, got {type(field).__name__}")
    for line_number, record in itertools.islice(_jsonl_records(path), 1):
        _jsonl_text(path, line_number, record, field)

    def documents() -> Iterator[str]:
        for line_number, record in _jsonl_records(path):
            text = _jsonl_text(path, line_number, record, field)
            if text is not None:
                yield text

    return documents()


def parquet_texts(
    path: str | os.PathLike[str], column: str = "text", *, batch_size: int = 1024
) -> Iterator[str]:
    """Yield the values of a string column of a Parquet file, in file order.

    The file is streamed ``batch_size`` rows at a time (pyarrow ``ParquetFile.iter_batches``,
    reading only ``column``), so files larger than memory work. Null values are skipped.

    Args:
        path: a Parquet file.
        column: the string column holding the document text: ``string``, ``large_string`` or
            ``string_view``, or a dictionary-encoded one (what pandas writes for a categorical
            column), decoded as it is read.
        batch_size: rows per read (>= 1).

    Yields:
        Each document (str).

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory (the message says which).
        ValueError: the file is not Parquet, or has no column ``column`` (the message lists the
            columns).
        TypeError: ``column`` is not a string column (nor a dictionary of strings).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = check_file("path", path)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    try:
        with pq.ParquetFile(path) as parquet_file:
            schema = parquet_file.schema_arrow
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"path={str(path)!r} must be a Parquet file: {error}") from None
    if column not in schema.names:
        raise ValueError(f"column={column!r} is not in {str(path)!r} (columns: {schema.names})")
    column_type = schema.field(column).type
    string_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16

    def is_string(data_type) -> bool:
        return pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or string_view(data_type)

    encoded = pa.types.is_dictionary(column_type)
    if not (is_string(column_type) or (encoded and is_string(column_type.value_type))):
        raise TypeError(
            f"column={column!r} of {str(path)!r} must hold strings (string, large_string, string_view, or a "
            f"dictionary of them), got {column_type}"
        )

    def documents() -> Iterator[str]:
        with pq.ParquetFile(path) as parquet_file:
            for record_batch in parquet_file.iter_batches(batch_size=batch_size, columns=[column]):
                values = record_batch.column(0)
                # A categorical column may come back dictionary-encoded: its values are the texts.
                if pa.types.is_dictionary(values.type):
                    values = values.dictionary_decode()
                for text in values.to_pylist():
                    if text is not None:
                        yield text

    return documents()




def _hf_record_text(record: object, number: int, field: str) -> str | None:
    if not isinstance(record, dict) or field not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"field={field!r} is missing from record {number} (found {found})")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise TypeError(
            f"field={field!r} of record {number} must be a string, got {type(text).__name__}"
        )
    return text


def hf_dataset_texts(
    path: str,
    name: str | None = None,
    *,
    split: str = "train",
    field: str = "text",
    **load_kwargs: object,
) -> Iterator[str]:
    """Stream ``record[field]`` from a Hugging Face ``datasets`` dataset, in dataset order.

    Calls ``datasets.load_dataset(path, name, split=split, streaming=True, **load_kwargs)``:
    nothing is downloaded up front, records arrive as the iterator advances. A Hub dataset needs
    the network, e.g. ``hf_dataset_texts("HuggingFaceFW/fineweb", "sample-10BT")``; local files
    stream offline through the generic builders, e.g.
    ``hf_dataset_texts("json", data_files="my.jsonl")`` or ``hf_dataset_texts("parquet",
    data_files=["a.parquet", "b.parquet"])``. The first record is read when this is called, so a
    wrong ``field`` fails at once. Records whose field is null are skipped.

    Args:
        path: a Hub dataset id, a local dataset folder, or a builder name (``"json"``,
            ``"parquet"``, ``"text"``, ...) used with ``data_files``.
        name: the dataset configuration (subset), if it has several.
        split: the split to stream.
        field: the key holding the document text.
        **load_kwargs: passed on to ``datasets.load_dataset`` (``data_files``, ``revision``, ...);
            ``streaming`` is always True.

    Yields:
        Each document (str).

    Raises:
        ImportError: the optional ``datasets`` package is not installed.
        TypeError: ``path``, ``split`` or ``field`` is not a str, ``name`` neither a str nor
            ``None`` (checked before ``datasets`` is imported); a record's field is neither a
            string nor null (later records: when reached).
        ValueError: ``streaming`` was passed, or the first record lacks ``field`` (the message
            lists the keys found).
        Exceptions of ``datasets.load_dataset`` itself (``FileNotFoundError`` for missing local
        files, connection errors offline) pass through.

    Source: Hugging Face ``datasets``, "Stream" (``load_dataset(..., streaming=True)``).
    """
    for argument, value in (("path", path), ("split", split), ("field", field)):
        if not isinstance(value, str):
            raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if name is not None and not isinstance(name, str):  # else datasets' "argument of type 'int' is not iterable"
        raise TypeError(f"name must be a str (a dataset configuration) or None, got {type(name).__name__}: {name!r:.40}")
    if "streaming" in load_kwargs:
        raise ValueError(
            f"hf_dataset_texts always streams; do not pass streaming={load_kwargs['streaming']!r}"
        )
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "hf_dataset_texts needs the optional datasets package: pip install datasets"
        ) from None
    dataset = datasets.load_dataset(path, name, split=split, streaming=True, **load_kwargs)
    for record in itertools.islice(dataset, 1):
        _hf_record_text(record, 0, field)

    def documents() -> Iterator[str]:
        for number, record in enumerate(dataset):
            text = _hf_record_text(record, number, field)
            if text is not None:
                yield text

    return documents()
