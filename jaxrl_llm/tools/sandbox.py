"""Run untrusted Python (model-written code) and capture its output: `run_python`.

Backends, picked by `SandboxConfig.backend` (gin: `SandboxConfig.backend = "..."`):
  "bwrap"          bubblewrap namespaces + rlimits;
  "subprocess"     a plain child process + rlimits: weaker; only when chosen explicitly,
                   and announced with a warning in every process that uses it;
  "sandbox_fusion" an HTTP SandboxFusion server (`tools/sandbox_fusion.py`);
  "auto"           "bwrap" when a probe run through bubblewrap succeeds on this machine
                   (tried once per process and cached).
Fails closed: when bubblewrap does not work here, "auto" and "bwrap" refuse to run code
(`SandboxUnavailable`, saying how to install bubblewrap or opt in to "subprocess"); nothing
falls back to the weaker backend on its own.

What the "bwrap" backend guards (one test each in tests/tools/test_sandbox_adversarial.py):
  - Network: a new network namespace with no interfaces besides a downed loopback, so no
    connection to the host, the LAN or the internet (--unshare-net).
  - Files: the filesystem is a fresh mount namespace holding only /usr (+ the /lib, /lib64,
    /bin, /sbin links or read-only binds), /etc/ld.so.cache, the base Python prefix
    (`sys.base_prefix`, read-only) and `SandboxConfig.import_paths` (read-only; the word
    "site-packages" there stands for this environment's, so numpy / sympy import). The project
    tree, the virtualenv, /root, /home and /work are absent. /tmp (also the working directory
    and $HOME) is a private tmpfs of `tmp_mb` MiB, discarded when the run ends.
  - Processes: a new PID namespace; the code cannot see or signal the trainer, and when the
    run ends (or is killed) the kernel kills every process left in the namespace. Run by
    root, bubblewrap keeps no capabilities for the code, which runs as a per-run unprivileged
    uid (`uid_base` + slot), so RLIMIT_NPROC is enforced (the kernel exempts uid 0 from it)
    and one run's fork bomb does not starve another's, in this process or another on the
    host (a slot is claimed host-wide with a lock file, `tools/sandbox_uids.py`). Run by
    another user, bubblewrap puts the code in a new user namespace, where RLIMIT_NPROC is
    counted per namespace.
  - Resources: rlimits on CPU seconds (timeout + 1), address space (`memory_mb` for each
    process: a run's processes together may map `max_processes` x `memory_mb`), tasks
    (`max_processes`), file size (`max_file_mb`), open files, no core dumps; a wall-clock
    timeout that SIGKILLs the whole process group; stdout/stderr are read while the code runs
    and only `max_output_bytes` of each are kept (head and tail); beyond `kill_output_bytes`
    the run is killed. Non-UTF-8 output is decoded with replacement characters.
What it does not guard:
  - Kernel exploits and side channels: a namespace sandbox shares the host kernel.
  - Total CPU and memory across many concurrent runs (only per-process rlimits; no cgroups),
    and page cache or CPU time stolen from the trainer while code runs.
  - Reading world-readable files under /usr and the Python prefix (e.g. which packages are
    installed), and the IPC/UTS/cgroup namespaces' view of the kernel (uname, /proc/cpuinfo).
  - Determinism: time, randomness and hash seeds are those of the host.

The "subprocess" fallback applies the same rlimits, a fresh temporary working directory, a
scrubbed environment, `python -I`, a new session with a whole-group kill, and an extra fork
so that `os.getppid()` is not the trainer. It does NOT isolate the network or the
filesystem (the code can read and write anything the trainer's user can), and when the
trainer runs as root the kernel ignores RLIMIT_NPROC, so a fork bomb is bounded only by the
timeout and a process that calls setsid() escapes the group kill. It exists so that a laptop
without bubblewrap can still run the built-in default once its user opts in; never use it
for code you do not trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from jaxrl_llm.tools import sandbox_fusion
from jaxrl_llm.tools.sandbox_types import CappedBuffer, ExecResult, SandboxConfig
from jaxrl_llm.tools.sandbox_uids import claim_slot, lock_directory

logger = logging.getLogger(__name__)


def run_python(
    code: str,
    *,
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    config: SandboxConfig | None = None,
) -> ExecResult:
    """Runs `code` as a Python program and returns its output; never raises for bad code
    (a character UTF-8 cannot encode, such as a lone surrogate, is fed as "?").

    Safe to call from many threads at once (see `tools/executor.py` for a pool). Raises
    `SandboxUnavailable` (without running anything) when the configured backend cannot
    isolate code here.
    """
    config = config or SandboxConfig()
    config = dataclasses.replace(
        config,
        timeout_s=config.timeout_s if timeout_s is None else timeout_s,
        memory_mb=config.memory_mb if memory_mb is None else memory_mb,
    )
    backend = resolve_backend(config.backend)
    if backend == "sandbox_fusion":
        return sandbox_fusion.run_code(code, config=config)
    mode = _bwrap_mode(config) if backend == "bwrap" else None
    return _run_in_slot(code, config, mode)


class SandboxUnavailable(RuntimeError):
    """The configured backend cannot isolate code on this machine; nothing was run."""


def bwrap_available() -> bool:
    """Whether bubblewrap runs code here (probed once per process)."""
    return _bwrap_mode(SandboxConfig(backend="bwrap")) is not None


def resolve_backend(backend: str) -> str:
    """The backend that will run code: 'auto' -> 'bwrap'. Fails closed: raises
    `SandboxUnavailable` for 'auto' or 'bwrap' when bubblewrap does not work here; an
    explicit 'subprocess' is allowed and warned about (once per process)."""
    if backend in ("auto", "bwrap"):
        if not bwrap_available():
            raise SandboxUnavailable(_refusal())
        return "bwrap"
    if backend == "subprocess":
        _warn_weak_once()
    return backend


def _refusal() -> str:
    return (
        f"Refusing to run model-written code: bubblewrap is unavailable ({_PROBE_ERROR[0]}). "
        "Install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
        "bubblewrap; it also needs unprivileged user namespaces, or root), or opt in to the "
        "weaker sandbox explicitly with --gin_param 'SandboxConfig.backend = \"subprocess\"' "
        "(rlimits only: the code can read and write your files and use the network), or "
        'run a SandboxFusion server and set SandboxConfig.backend = "sandbox_fusion".'
    )


# Runs inside the sandbox as `python -I -c _LAUNCHER <json>`, code on stdin. Limits are set
# here, after bubblewrap built the namespaces, so that RLIMIT_NPROC counts this run's tasks.
_LAUNCHER = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
src = sys.stdin.buffer.read()
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
for name, value in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
if cfg["fork"]:
    pid = os.fork()
    if pid:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code < 0:
            os.kill(os.getpid(), -code)
        os._exit(code % 256)
with open("main.py", "wb") as f:
    f.write(src)
sys.path[:0] = cfg["paths"]
sys.argv = ["main.py"]
try:
    exec(compile(src, "main.py", "exec"), {"__name__": "__main__", "__file__": "main.py"})
except SystemExit:
    raise
except BaseException as e:  # print the traceback without this launcher's frame
    import traceback
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
"""

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}


def base_python() -> str:
    """The interpreter the sandbox runs: the real file behind sys.executable (a venv's python
    is a link to it), so only the base prefix has to be visible inside."""
    return os.path.realpath(sys.executable)


def _rlimits(config: SandboxConfig) -> list[tuple[str, int]]:
    mib = 1024 * 1024
    return [
        ("RLIMIT_CPU", int(config.timeout_s) + 1),
        ("RLIMIT_AS", config.memory_mb * mib),
        ("RLIMIT_NPROC", config.max_processes),
        ("RLIMIT_FSIZE", config.max_file_mb * mib),
        ("RLIMIT_NOFILE", config.max_open_files),
        ("RLIMIT_CORE", 0),
    ]


def _bwrap_argv(config: SandboxConfig, mode: str) -> list[str]:
    argv = [_PROBE.get("bwrap") or "bwrap", "--die-with-parent", "--new-session"]
    if mode == "privileged":  # root: no user namespace, so a real non-zero uid can be used
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/bin", "/sbin", "/lib32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # The private /tmp first: read-only binds of paths under /tmp (a checkout or virtualenv
    # there, as in a CI clone) then land on top of it instead of being hidden by it.
    argv += ["--perms", "1777", "--size", str(config.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    ro_dirs = [sys.base_prefix, os.path.dirname(os.path.dirname(base_python()))]
    ro_dirs += list(config.resolved_import_paths())
    made = set()
    for path in dict.fromkeys(os.path.realpath(p) for p in ro_dirs):
        if path == "/usr" or path.startswith("/usr/"):
            continue
        # Parents bubblewrap would create copy the host's modes (/root is 0700), which would
        # lock the unprivileged uid out of the interpreter; make them traversable.
        parts = path.strip("/").split("/")[:-1]
        for parent in ("/" + "/".join(parts[: i + 1]) for i in range(len(parts))):
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", path, path]
    # The base installation's own site-packages (and its .pth start-up hooks) stay hidden:
    # the sandbox sees the standard library plus `import_paths`, whatever the host installed.
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base_site = os.path.join(os.path.realpath(sys.base_prefix), "lib", version, "site-packages")
    if os.path.isdir(base_site) and base_site not in config.resolved_import_paths():
        argv += ["--tmpfs", base_site]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for key, value in _ENV.items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]


def _run_in_slot(code: str, config: SandboxConfig, mode: str | None) -> ExecResult:
    """`_run_local` in a uid slot no other run on the host holds (`sandbox_uids`) when the
    code runs as a per-run uid ('privileged' mode); slot 0, unclaimed, otherwise."""
    if mode != "privileged":
        return _run_local(code, config, mode=mode, slot=0)
    with contextlib.ExitStack() as stack:
        try:
            slot = stack.enter_context(claim_slot(lock_directory(config.uid_base)))
        except OSError as e:
            error = f"cannot claim a sandbox uid: {e}"
            return ExecResult("", "", None, False, backend="bwrap", sandbox_error=error)
        return _run_local(code, config, mode=mode, slot=slot)


def _run_local(code: str, config: SandboxConfig, *, mode: str | None, slot: int) -> ExecResult:
    run_as_uid = config.uid_base + slot if mode == "privileged" else None
    launcher_cfg = {
        "rlimits": _rlimits(config),
        "uid": run_as_uid,
        "fork": mode is None,
        "paths": list(config.resolved_import_paths()),
    }
    argv = [base_python(), "-I", "-c", _LAUNCHER, json.dumps(launcher_cfg)]
    workdir = None
    if mode is None:
        workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
        env = dict(_ENV, HOME=workdir, TMPDIR=workdir)
    else:
        argv = _bwrap_argv(config, mode) + argv
        env = {"PATH": _ENV["PATH"], "LANG": "C.UTF-8"}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir or "/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        _remove_tree(workdir)
        return ExecResult("", "", None, False, backend=mode or "subprocess", sandbox_error=str(e))
    try:
        source = code.encode(errors="replace")
        out, err, timed_out, truncated = _communicate_capped(proc, source, config)
    finally:
        _kill_group(proc)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
        _remove_tree(workdir)
    return ExecResult(
        stdout=out,
        stderr=err,
        exit_code=proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        output_truncated=truncated,
        backend="bwrap" if mode else "subprocess",
    )


def _communicate_capped(
    proc: subprocess.Popen, stdin: bytes, config: SandboxConfig
) -> tuple[str, str, bool, bool]:
    """Feeds stdin and reads both pipes until exit, the deadline, or too much output."""
    buffers = {proc.stdout: CappedBuffer(config.max_output_bytes)}
    buffers[proc.stderr] = CappedBuffer(config.max_output_bytes)
    deadline = time.monotonic() + config.timeout_s
    timed_out = overflow = False
    with selectors.DefaultSelector() as sel:
        for pipe in buffers:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
        pending = memoryview(stdin)
        while len(sel.get_map()) > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=remaining):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending[:65536]) :]
                    except (BrokenPipeError, BlockingIOError) as e:
                        pending = pending[:0] if isinstance(e, BrokenPipeError) else pending
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                buffers[key.fileobj].add(data)
            if sum(b.total for b in buffers.values()) > config.kill_output_bytes:
                overflow = True
                break
    if timed_out or overflow:
        _kill_group(proc)
    else:  # pipes closed; the process is exiting
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    stdout_buf, stderr_buf = buffers[proc.stdout], buffers[proc.stderr]
    err = stderr_buf.text()
    if overflow:
        err += f"\n[sandbox] output exceeded {config.kill_output_bytes} bytes; killed\n"
    truncated = overflow or any(b.total > 2 * b.half for b in buffers.values())
    return stdout_buf.text(), err, timed_out, truncated


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _remove_tree(path: str | None) -> None:
    if path:
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)


_PROBE_LOCK = threading.Lock()
_PROBE: dict[str, str | None] = {}
_PROBE_ERROR = ["bubblewrap not probed"]
_WARNED = threading.Event()


def _bwrap_mode(config: SandboxConfig) -> str | None:
    """'privileged' (root), 'userns' (unprivileged) or None when bwrap cannot run here.

    Decided by running a tiny program through the full launcher once and caching the answer,
    because an installed bwrap may still fail (no user namespaces, no CAP_SYS_ADMIN, uids
    outside the container's map).
    """
    with _PROBE_LOCK:
        if "mode" not in _PROBE:
            _PROBE["mode"] = _probe_bwrap(config)
        return _PROBE["mode"]


def _probe_bwrap(config: SandboxConfig) -> str | None:
    _PROBE["bwrap"] = shutil.which("bwrap")
    if not _PROBE["bwrap"]:
        _PROBE_ERROR[0] = "bwrap is not installed"
        return None
    modes = ["privileged", "userns"] if os.geteuid() == 0 else ["userns"]
    probe_config = dataclasses.replace(config, timeout_s=20.0, memory_mb=512)
    errors = []
    for mode in modes:
        result = _run_in_slot("print(6 * 7)", probe_config, mode)
        if result.stdout.strip() == "42" and result.exit_code == 0:
            return mode
        errors.append(f"{mode}: exit {result.exit_code}: {result.stderr.strip()[-300:]}")
    _PROBE_ERROR[0] = "bubblewrap does not work here: " + "; ".join(errors)
    return None


def _warn_weak_once() -> None:
    if _WARNED.is_set():
        return
    _WARNED.set()
    message = (
        "SANDBOX IS WEAK: SandboxConfig.backend = 'subprocess' was chosen. Model-written "
        "code runs as a plain subprocess with rlimits only: it can read and write your "
        "files and use the network. Install bubblewrap (apt-get install bubblewrap) and use "
        "backend 'auto', or use the sandbox_fusion backend."
    )
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
