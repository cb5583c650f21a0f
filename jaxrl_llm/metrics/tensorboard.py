"""TensorBoard event files through tensorboardX, also into a `gs://` run directory.

tensorboardX writes events without TensorFlow, and picks a record writer by the path's
scheme. Its own `gs://` writer needs `google-cloud-storage` and its own credentials; here
`gs://` is re-registered to write through `etils.epath` instead, the layer every other run
file uses (gcsfs on a TPU VM, the mock backend in tests). An object cannot be appended to,
so each flush rewrites the event file whole (as tensorboardX's own GCS writer does); event
files hold scalars and a few text samples per step, kilobytes per run.

tensorboardX's writer module imports PyTorch when it is installed, for one type alias
(`writer.numpy_compatible`, used in annotations only): 3.3 s of a run's start on a 2-core
AMD EPYC host (`python -X importtime`, 2026-12-04), for a library training never uses.
Unless PyTorch is loaded already, `_tensorboardx` hides it for that one import
(tensorboardX then takes numpy's array type, its own fallback).
"""

from __future__ import annotations

import io
import logging
import os
import sys
import weakref
from typing import Any

from etils import epath

log = logging.getLogger(__name__)
FOLDER = "tensorboard"


class _EpathRecordWriter:
    """A tensorboardX record file on an object store: buffered, rewritten whole per flush."""

    def __init__(self, path: str):
        self.path = epath.Path(path)
        self.buffer = io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        self.path.write_bytes(self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EpathRecordWriterFactory:
    def open(self, path: str) -> _EpathRecordWriter:
        return _EpathRecordWriter(path)

    def directory_check(self, path: str) -> None:
        epath.Path(path).mkdir(parents=True, exist_ok=True)


def summary_writer(
    run_dir: str | os.PathLike, *, purge_step: int | None = None, **kwargs: Any
) -> Any | None:
    """A tensorboardX `SummaryWriter` on run_dir/tensorboard, or None (logged) without
    tensorboardX. `kwargs` go to `SummaryWriter` (e.g. `filename_suffix`).

    `purge_step`: the new event file starts with a `SessionLog.START` event at that step,
    on which TensorBoard's Python loader (`EventAccumulator`, `--load_fast=false`) drops
    the events at steps >= purge_step of the files read before it (files are read in name
    order, so earlier sessions' files): a resumed run's rewritten steps show once. That
    drop covers every tag of the folder, this session's other files included when they
    sort first; so a writer opened while another writer of this process has the folder
    open writes no START: the open one, opened earlier (its file sorts first, as long as
    it is opened first within the second or has no filename suffix), wrote the one this
    session needs. TensorBoard's default loader (the Rust data server) ignores the START:
    there a record at step s replaces its own series' records at steps >= s read before.
    """
    try:
        tbx = _tensorboardx()
    except ImportError:
        log.info("tensorboardX not installed; no TensorBoard events")
        return None
    tbx.record_writer.register_writer_factory("gs", _EpathRecordWriterFactory())
    folder = os.fspath(epath.Path(run_dir) / FOLDER)
    open_here = _OPEN.setdefault(folder, weakref.WeakSet())
    if any(w.all_writers is not None for w in open_here):  # tensorboardX: None once closed
        purge_step = None
    writer = tbx.SummaryWriter(folder, purge_step=purge_step, **kwargs)
    open_here.add(writer)
    return writer


# This process's writers by folder: who wrote this session's START (`summary_writer`).
_OPEN: dict[str, weakref.WeakSet[Any]] = {}


def _tensorboardx() -> Any:
    """The `tensorboardX` module, imported without importing PyTorch (module docstring).
    Called as a run starts its writers, before its producer or tool threads exist: another
    thread's `import torch` inside this window would fail."""
    if "torch" in sys.modules or "tensorboardX.writer" in sys.modules:
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # pyright: ignore[reportArgumentType]  # import torch: ImportError
    try:
        import tensorboardX
    finally:
        del sys.modules["torch"]
    return tensorboardX
