"""Readers that turn prompt data on disk into a stream of raw rows with their line numbers.

Formats (``SourceConfig.format``; ``"auto"`` picks one from the path):

- ``jsonl``: one JSON object per line; the line number is the file's 1-based line.
- ``json``: a JSON array of objects, as LIMR releases ``math.8k.json`` (``id``, ``prompt``,
  ``answer``, ``source``); the line number is the line on which each object starts, and
  objects that start on the same line as another (a compact array, as ``json.dump(rows, f)``
  writes it) also carry their 0-based position in the array (``RawRecord.element``).
- ``parquet`` (pyarrow): verl-style files; the "line" is the 1-based row number.
- ``arrow``: an Arrow IPC stream or file (what ``datasets.save_to_disk`` writes).
- ``hf``: a local Hugging Face-format folder, read without the ``datasets`` package:
  a ``save_to_disk`` folder (``state.json`` listing ``*.arrow`` shards, or a
  ``dataset_dict.json`` with one such folder per split), or a hub-style folder of
  ``*.parquet`` / ``*.jsonl`` / ``*.json`` / ``*.arrow`` files whose names (or parent folder)
  start with the split name, e.g. ``data/train-00000-of-00001.parquet`` or ``train/x.jsonl``.
  Scripts (``load_dataset("foo.py")``) and remote repositories are not supported.
- ``tfds``: ``tfds.data_source(name, split=, data_dir=)`` over an already prepared local
  ``data_dir`` (ArrayRecord files); never downloads. TensorFlow Datasets is imported only here,
  when such a source is read, because importing it is slow.

Paths go through ``etils.epath``, so a file or folder on ``gs://`` (or ``s3://``) reads
like a local one (with ``gcsfs``/``s3fs`` installed; ``pip install 'jaxrl-llm[gcs]'``).

A row that cannot be parsed (bad JSON, bad UTF-8, not an object) comes out as a ``RawRecord``
with ``row=None`` and an ``error``; deciding whether that skips or raises is the caller's job
(see ``jaxrl_llm.data.examples``). A source that cannot be read at all (a missing file, a JSON
array with a syntax error or bad UTF-8, a parquet file pyarrow cannot read, an unknown suffix,
a folder without the split) raises
``DataSourceError`` at once, before any training starts: a ``ConfigError``, so the command
line ends with its one-line message (exit 2), not a traceback. A UTF-8 byte-order mark at the
start of a ``jsonl`` or ``json`` file is ignored.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
from etils import epath

from jaxrl_llm.config_checks import ConfigError, checked_fields

FORMATS = ("auto", "jsonl", "json", "parquet", "arrow", "hf", "tfds")
_FILE_SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
_WHITESPACE = re.compile(r"\s*")


class DataSourceError(ConfigError):
    """A data source that cannot be read at all: missing, or not in the format it claims."""


@dataclasses.dataclass(frozen=True)
@checked_fields(format=FORMATS)
class SourceConfig:
    """Where prompts come from.

    Attributes:
      path: a file or folder; for ``format="tfds"`` the TFDS name, e.g. ``"math_dataset/x"``.
      format: one of ``FORMATS``; ``"auto"`` decides from the suffix (a folder is ``"hf"``).
      split: the split to read from ``hf`` folders and TFDS datasets.
      data_dir: TFDS only: the local ``data_dir`` holding the prepared dataset.
    """

    path: str
    format: str = "auto"
    split: str = "train"
    data_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class RawRecord:
    """One row as read from disk.

    Attributes:
      source: the file it came from (``"tfds:<name>/<split>"`` for TFDS).
      line: 1-based line number (jsonl, json) or row number (parquet, arrow, tfds).
      row: the parsed object, or None when it could not be parsed.
      error: why ``row`` is None.
      text: jsonl only: the line exactly as in the file, so selections can copy it unchanged.
      element: json arrays only, for an object whose line another object also starts on: its
        0-based position in the array (the line alone does not tell them apart); else None.
      name: the file's name in default ids when its base name does not tell it apart: in an
        ``hf`` folder where another chosen file has the same base name, its path relative to
        the folder (``"train/en/data.jsonl"``); else None (the base name is used).
    """

    source: str
    line: int
    row: dict[str, Any] | None
    error: str | None = None
    text: str | None = None
    element: int | None = None
    name: str | None = None


def detect_format(config: SourceConfig) -> str:
    """Returns the concrete format of ``config`` (resolving ``"auto"``)."""
    if config.format not in FORMATS:
        raise ValueError(f"unknown data format {config.format!r}; expected one of {FORMATS}")
    if config.format != "auto":
        return config.format
    path = epath.Path(config.path)
    if path.is_dir():
        return "hf"
    fmt = _FILE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise DataSourceError(
            f"cannot tell the format of {config.path!r} from its suffix; set format= to one of "
            f"{FORMATS[1:]}"
        )
    return fmt


def require_source(path: str, field: str = "data source") -> None:
    """Raises ``DataSourceError`` naming ``field`` (the config field, or the ``--flag``, that
    gave ``path``) unless ``path`` is an existing file or folder."""
    if epath.Path(path).exists():
        return
    given = f"{field} {path!r}" if field.startswith("--") else f"{field} = {path!r}"
    relative = "://" not in path and not os.path.isabs(path)
    where = f" (relative to {os.getcwd()})" if relative else ""
    raise DataSourceError(
        f"{given}: no such file or folder{where}; expected a prompt file "
        f"({', '.join(_FILE_SUFFIXES)}) or a Hugging Face dataset folder; fix the path"
    )


def read_records(config: SourceConfig) -> Iterator[RawRecord]:
    """Yields every row of the source described by ``config``, in file order."""
    if config.format != "tfds":
        require_source(config.path)
    fmt = detect_format(config)
    if fmt == "tfds":
        yield from read_tfds(config.path, split=config.split, data_dir=config.data_dir)
        return
    path = epath.Path(config.path)
    if fmt == "hf":
        yield from read_hf_folder(path, split=config.split)
    else:
        yield from read_file(path, fmt)


def read_file(path: epath.PathLike, fmt: str) -> Iterator[RawRecord]:
    """Reads one file of a known format (``jsonl``, ``json``, ``parquet`` or ``arrow``)."""
    readers = {
        "jsonl": read_jsonl,
        "json": read_json_array,
        "parquet": read_parquet,
        "arrow": read_arrow,
    }
    if fmt not in readers:
        raise ValueError(f"{path}: {fmt!r} is not a single-file format")
    return readers[fmt](epath.Path(path))


def read_jsonl(path: epath.PathLike) -> Iterator[RawRecord]:
    """One object per line; blank lines are ignored, broken lines come back with an error."""
    path = epath.Path(path)
    with path.open("rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield RawRecord(str(path), line_number, None, f"invalid UTF-8: {e.reason}")
                continue
            if line_number == 1:  # a byte-order mark (Windows editors) is not part of the row
                text = text.removeprefix("\ufeff")
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                yield RawRecord(str(path), line_number, None, f"invalid JSON: {e.msg}", text)
                continue
            if not isinstance(obj, dict):
                error = f"expected a JSON object, got {type(obj).__name__}"
                yield RawRecord(str(path), line_number, None, error, text)
                continue
            yield RawRecord(str(path), line_number, obj, None, text)


def read_json_array(path: epath.PathLike) -> Iterator[RawRecord]:
    """A JSON array of objects, decoded one element at a time to know each one's line.

    A syntax error anywhere makes the rest of an array unreadable, so it raises
    ``DataSourceError`` with the line and column rather than skipping. Objects that share
    their starting line get ``element``, their position in the array.
    """
    elements = list(_json_array_elements(epath.Path(path)))
    per_line = collections.Counter(line for line, _ in elements)
    for index, (line, obj) in enumerate(elements):
        element = index if per_line[line] > 1 else None
        if isinstance(obj, dict):
            yield RawRecord(str(path), line, obj, element=element)
        else:
            error = f"expected a JSON object, got {type(obj).__name__}"
            yield RawRecord(str(path), line, None, error, element=element)


def _json_array_elements(path: epath.Path) -> Iterator[tuple[int, Any]]:
    """(line on which it starts, decoded value) of each element of the JSON array at ``path``."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        before = raw[: e.start].decode("utf-8")
        raise _position_error(path, before, len(before), f"invalid UTF-8: {e.reason}") from e
    decoder = json.JSONDecoder()

    def skip(pos: int) -> int:
        return _WHITESPACE.match(text, pos).end()

    def fail(pos: int, message: str) -> DataSourceError:
        return _position_error(path, text, pos, message)

    pos = skip(1 if text.startswith("\ufeff") else 0)  # a byte-order mark is not JSON
    if not text.startswith("[", pos):
        raise fail(pos, "expected a JSON array of objects")
    pos = skip(pos + 1)
    if text.startswith("]", pos):
        return
    line, counted_to = 1, 0
    while True:
        line += text.count("\n", counted_to, pos)
        counted_to = pos
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise fail(e.pos, f"invalid JSON: {e.msg}") from e
        yield line, obj
        pos = skip(end)
        if text.startswith(",", pos):
            pos = skip(pos + 1)
        elif text.startswith("]", pos):
            if skip(pos + 1) != len(text):
                raise fail(skip(pos + 1), "unexpected data after the JSON array")
            return
        else:
            raise fail(pos, "expected ',' or ']' in the JSON array")


def _position_error(path: epath.Path, text: str, pos: int, message: str) -> DataSourceError:
    """``DataSourceError`` at character ``pos`` of ``text``, as ``<path>:<line>:<column>``."""
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return DataSourceError(f"{path}:{line}:{column}: {message}")


def read_parquet(path: epath.PathLike) -> Iterator[RawRecord]:
    """Rows of a parquet file (needs ``pyarrow``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with epath.Path(path).open("rb") as f:
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError) as e:  # pyarrow names the file '<Buffer>'
            raise DataSourceError(f"{path}: cannot read as parquet: {e}") from e
    yield from _table_records(str(path), table)


def read_arrow(path: epath.PathLike) -> Iterator[RawRecord]:
    """Rows of an Arrow IPC stream (``datasets.save_to_disk`` shards) or IPC file."""
    yield from _table_records(str(path), _read_arrow_table(epath.Path(path)))


def _read_arrow_table(path: epath.Path):
    import pyarrow as pa

    def source():  # a local file is memory-mapped; a remote one read into memory
        if "://" in str(path):
            return pa.BufferReader(path.read_bytes())
        return pa.memory_map(str(path))

    try:
        try:
            with source() as f:
                return pa.ipc.open_stream(f).read_all()
        except pa.ArrowInvalid:
            with source() as f:
                return pa.ipc.open_file(f).read_all()
    except (pa.ArrowException, OSError) as e:
        raise DataSourceError(f"{path}: cannot read as Arrow IPC (stream or file): {e}") from e


def _table_records(source: str, table) -> Iterator[RawRecord]:
    row_number = 0
    for batch in table.to_batches():
        for row in batch.to_pylist():
            row_number += 1
            yield RawRecord(source, row_number, row)


def hf_data_files(folder: epath.PathLike, split: str) -> list[tuple[epath.Path, str]]:
    """The data files of ``split`` in a Hugging Face-format folder, with their formats.

    ``save_to_disk`` layouts are read from their own metadata (``dataset_dict.json``,
    ``state.json``); other folders are searched for data files named after the split.
    """
    folder = epath.Path(folder)
    dict_meta = folder / "dataset_dict.json"
    if dict_meta.exists():
        splits = json.loads(dict_meta.read_text())["splits"]
        if split not in splits:
            raise DataSourceError(f"{folder}: no split {split!r}; it has {splits}")
        return hf_data_files(folder / split, split)
    state = folder / "state.json"
    if state.exists():
        shards = json.loads(state.read_text())["_data_files"]
        return [(folder / shard["filename"], "arrow") for shard in shards]
    files = sorted(  # walk, not rglob: epath refuses `**` (one request per folder on GCS)
        root / name
        for root, _, names in folder.walk()
        for name in names
        if epath.Path(name).suffix.lower() in _FILE_SUFFIXES
    )
    files = [p for p in files if p.name not in ("dataset_info.json", "state.json")]
    split_re = re.compile(rf"^{re.escape(split)}([-._ 0-9]|$)", re.IGNORECASE)
    chosen = [
        p
        for p in files
        if split_re.match(p.name) or any(split_re.match(d) for d in p.relative_to(folder).parts)
    ]
    if not chosen:
        raise DataSourceError(
            f"{folder}: no data files for split {split!r} among {len(files)} files"
        )
    return [(p, _FILE_SUFFIXES[p.suffix.lower()]) for p in chosen]


def read_hf_folder(folder: epath.PathLike, split: str = "train") -> Iterator[RawRecord]:
    """Rows of one split of a local Hugging Face-format folder (see the module docstring).

    Files that share a base name (``train/en/data.jsonl``, ``train/fr/data.jsonl``) get their
    path relative to ``folder`` as ``RawRecord.name``, so rows without an id get distinct ids.
    """
    folder = epath.Path(folder)
    files = hf_data_files(folder, split)
    base_names = collections.Counter(path.name for path, _ in files)
    for path, fmt in files:
        if base_names[path.name] == 1:
            yield from read_file(path, fmt)
            continue
        name = path.relative_to(folder).as_posix()
        for record in read_file(path, fmt):
            yield dataclasses.replace(record, name=name)


def read_tfds(name: str, split: str = "train", data_dir: str | None = None) -> Iterator[RawRecord]:
    """Rows of a prepared TFDS dataset through ``tfds.data_source`` (random access, no TF graph).

    Bytes features are decoded as UTF-8 and numpy values become Python values.
    """
    import tensorflow_datasets as tfds  # slow import (TensorFlow), so only when used

    check_tfds(name, data_dir)
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    tag = f"tfds:{name}/{split}"
    for index in range(len(source)):
        row = _to_python(source[index])
        if isinstance(row, dict):
            yield RawRecord(tag, index + 1, row)
        else:
            yield RawRecord(tag, index + 1, None, f"expected a feature dict, got {type(row)}")


def check_tfds(name: str, data_dir: str | None = None) -> None:
    """``DataSourceError`` unless ``tfds:name`` names a registered TFDS builder (TFDS's own
    error spans a page: the list of every dataset it knows)."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.registered import DatasetNotFoundError

    try:
        tfds.builder(name, data_dir=data_dir)
    except DatasetNotFoundError:
        raise DataSourceError(
            f"tfds:{name}: no TFDS dataset of that name; check the name (tfds.list_builders())"
        ) from None


def _to_python(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_to_python(v) for v in value.tolist()] if value.ndim else _to_python(value.item())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_to_python(v) for v in value]
    return value
