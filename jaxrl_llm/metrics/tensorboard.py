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


def summary_writer(run_dir: str | os.PathLike, **kwargs: Any) -> Any | None:
    """A tensorboardX `SummaryWriter` on run_dir/tensorboard, or None (logged) without
    tensorboardX. `kwargs` go to `SummaryWriter` (e.g. `filename_suffix`)."""
    try:
        tbx = _tensorboardx()
    except ImportError:
        log.info("tensorboardX not installed; no TensorBoard events")
        return None
    tbx.record_writer.register_writer_factory("gs", _EpathRecordWriterFactory())
    return tbx.SummaryWriter(os.fspath(epath.Path(run_dir) / FOLDER), **kwargs)


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
