"""The sandbox's records: how code runs (`SandboxConfig`), what it produced (`ExecResult`),
and the capped output buffer every backend uses. No process handling here: that is in
`sandbox.py` (bubblewrap / subprocess) and `sandbox_fusion.py` (HTTP)."""

from __future__ import annotations

import dataclasses
import os
import sysconfig

import gin

from jaxrl_llm.config_checks import Ge, Gt, checked_fields

BACKENDS = ("auto", "bwrap", "subprocess", "sandbox_fusion")
SITE_PACKAGES = "site-packages"


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one run of code produced.

    exit_code: the process's status; negative means killed by that signal (-9 on timeout or
      output overflow), None when the sandbox itself failed (see `sandbox_error`).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    duration_s: float = 0.0
    output_truncated: bool = False
    backend: str = ""
    sandbox_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.sandbox_error is None


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(backend=BACKENDS, timeout_s=Gt(0), memory_mb=Ge(32))
class SandboxConfig:
    """How code runs; `run_python`'s timeout_s and memory_mb override the first two.

    gin-configurable, so a run sets the Python tool's sandbox from its config, e.g.
    `SandboxConfig.timeout_s = 5.0`, `SandboxConfig.memory_mb = 2048`,
    `SandboxConfig.import_paths = ("site-packages",)`, `SandboxConfig.backend = "bwrap"`.
    """

    timeout_s: float = 10.0
    memory_mb: int = 1024
    backend: str = "auto"
    max_output_bytes: int = 64 * 1024
    kill_output_bytes: int = 8 * 1024 * 1024
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 256
    tmp_mb: int = 64
    # Read-only directories added to sys.path inside the sandbox, e.g. a site-packages with
    # numpy/sympy for ToRL-style code; "site-packages" stands for this environment's own
    # (its purelib and platlib). The project itself is never needed.
    import_paths: tuple[str, ...] = ()
    # Per-run uids when bubblewrap runs as root: uid_base + slot, slot < max concurrent runs.
    uid_base: int = 1_000_000
    sandbox_fusion_url: str = "http://127.0.0.1:8080"

    def __post_init__(self):
        if isinstance(self.import_paths, list):  # gin writes lists as lists
            object.__setattr__(self, "import_paths", tuple(self.import_paths))
        if isinstance(self.import_paths, str):
            raise TypeError(
                f"SandboxConfig.import_paths = {self.import_paths!r}: expected a tuple of "
                "paths, e.g. ('site-packages',)"
            )
        for path in self.import_paths:
            if path != SITE_PACKAGES and not (os.path.isabs(path) and os.path.isdir(path)):
                raise ValueError(
                    f"SandboxConfig.import_paths entry {path!r}: expected an existing "
                    f"absolute directory or {SITE_PACKAGES!r}"
                )

    def resolved_import_paths(self) -> tuple[str, ...]:
        """`import_paths` with "site-packages" replaced by this environment's directories."""
        out: list[str] = []
        for path in self.import_paths:
            if path == SITE_PACKAGES:
                paths = sysconfig.get_paths()
                out += [paths["purelib"], paths["platlib"]]
            else:
                out.append(path)
        return tuple(dict.fromkeys(os.path.realpath(p) for p in out))


class CappedBuffer:
    """Keeps the first and last `cap // 2` bytes of a stream and counts what it dropped."""

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            del self.tail[: max(len(self.tail) - self.half, 0)]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        middle = f"\n...[{dropped} bytes truncated]...\n".encode() if dropped else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")
