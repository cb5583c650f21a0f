"""The sandbox's records: how code runs (`SandboxConfig`), what it produced (`ExecResult`),
and the capped output buffer every backend uses. No process handling here: that is in
`sandbox.py` (bubblewrap / subprocess) and `sandbox_fusion.py` (HTTP)."""

from __future__ import annotations

import dataclasses
import os
import sysconfig

import gin

from jaxrl_llm.config_checks import Ge, Gt, checked_fields, documented

BACKENDS = ("auto", "bwrap", "subprocess", "sandbox_fusion")
SITE_PACKAGES = "site-packages"


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one run of code produced.

    exit_code: the process's status, None when the sandbox itself failed (see
      `sandbox_error`). -9 when the sandbox killed the run (timeout, output overflow). A
      signal inside the run (a segfault, os.abort(), SIGKILL) reads as 128 + the signal
      under bwrap (139, 134, 137: bubblewrap's init reports it so) and as minus the signal
      under "subprocess"; a SandboxFusion server reports its own codes.
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

    timeout_s: float = documented(
        10.0, "Wall-clock seconds a run may take before its whole process group is killed."
    )
    memory_mb: int = documented(
        1024,
        "Address-space limit (RLIMIT_AS) of each of the code's processes, in MiB; a run may "
        "hold up to `max_processes` times as much. SandboxFusion gets it as memory_limit_MB.",
    )
    backend: str = documented(
        "auto",
        "How code runs: 'bwrap' (bubblewrap namespaces), 'subprocess' (rlimits only, weaker: "
        "opt in explicitly), 'sandbox_fusion' (an HTTP server), 'auto' ('bwrap' when it works "
        "here, else refuse).",
    )
    max_output_bytes: int = documented(
        64 * 1024, "Bytes kept of each of stdout and stderr (head and tail)."
    )
    kill_output_bytes: int = documented(
        8 * 1024 * 1024, "Total output in bytes beyond which the run is killed."
    )
    max_processes: int = documented(32, "Processes and threads the code may have at once.")
    max_file_mb: int = documented(16, "Largest file the code may write, in MiB.")
    max_open_files: int = documented(256, "File descriptors the code may have open.")
    tmp_mb: int = documented(
        64, "Size in MiB of the private /tmp (also the working directory and $HOME)."
    )
    import_paths: tuple[str, ...] = documented(
        (),
        "Read-only directories added to the code's sys.path, e.g. one with numpy and sympy "
        "for ToRL-style code; 'site-packages' stands for this environment's own.",
    )
    uid_base: int = documented(
        1_000_000,
        "First of the per-run user ids when bubblewrap runs as root (uid_base + slot; a slot "
        "is claimed host-wide, across processes, by a lock file in the temp directory).",
    )
    sandbox_fusion_url: str = documented(
        "http://127.0.0.1:8080", "Address of the SandboxFusion server (backend 'sandbox_fusion')."
    )

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
