"""SandboxFusion backend: runs code on a SandboxFusion server through its `run_code` API.

Request, POST {url}/run_code with JSON:
  {"code": ..., "language": "python", "run_timeout": s, "compile_timeout": s,
   "memory_limit_MB": mb}
Response JSON (the fields read here):
  {"status": "Success" | "Failed" | "SandboxError", "message": str,
   "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error",
                  "return_code": int | null, "stdout": str, "stderr": str,
                  "execution_time": float} | null}
The server does the isolating; what it guards is the server's business. Network errors,
HTTP errors and unreadable replies come back as `ExecResult.sandbox_error`, never raised.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from jaxrl_llm.tools.sandbox_types import CappedBuffer, ExecResult, SandboxConfig

# Seconds the HTTP call may take beyond the run timeout (queueing, process start).
HTTP_MARGIN_S = 30.0


def run_code(code: str, *, config: SandboxConfig) -> ExecResult:
    payload = {
        "code": code,
        "language": "python",
        "run_timeout": config.timeout_s,
        "compile_timeout": config.timeout_s,
        "memory_limit_MB": config.memory_mb,
    }
    request = urllib.request.Request(
        config.sandbox_fusion_url.rstrip("/") + "/run_code",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=config.timeout_s + HTTP_MARGIN_S) as reply:
            body = json.loads(reply.read(config.kill_output_bytes + 65536))
    except (OSError, ValueError) as e:  # URLError, HTTPError, timeouts, bad JSON
        return _failure(f"sandbox_fusion request failed: {e}", start)
    return parse_response(body, config=config, duration_s=time.monotonic() - start)


def parse_response(body: dict, *, config: SandboxConfig, duration_s: float = 0.0) -> ExecResult:
    """Maps a `run_code` reply onto `ExecResult` (stdout/stderr capped like local runs)."""
    run = body.get("run_result") if isinstance(body, dict) else None
    if not isinstance(run, dict):
        message = body.get("message") if isinstance(body, dict) else body
        return ExecResult(
            "", "", None, False, duration_s, backend="sandbox_fusion", sandbox_error=str(message)
        )
    texts = []
    for key in ("stdout", "stderr"):
        buffer = CappedBuffer(config.max_output_bytes)
        buffer.add((run.get(key) or "").encode("utf-8", errors="replace"))
        texts.append((buffer.text(), buffer.total > 2 * buffer.half))
    timed_out = run.get("status") == "TimeLimitExceeded"
    exit_code = run.get("return_code")
    if exit_code is None and body.get("status") == "Success":
        exit_code = 0
    if exit_code is None and not timed_out:
        exit_code = 1  # "Error" with no code: report a failure the caller can see
    return ExecResult(
        stdout=texts[0][0],
        stderr=texts[1][0],
        exit_code=exit_code,
        timed_out=timed_out,
        duration_s=duration_s,
        output_truncated=texts[0][1] or texts[1][1],
        backend="sandbox_fusion",
    )


def _failure(message: str, start: float) -> ExecResult:
    return ExecResult(
        "",
        "",
        None,
        False,
        time.monotonic() - start,
        backend="sandbox_fusion",
        sandbox_error=message,
    )
