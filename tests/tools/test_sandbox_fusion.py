"""The SandboxFusion backend against a tiny fake server on 127.0.0.1."""

import http.server
import json
import threading
import typing

import pytest

from jaxrl_llm.tools import SandboxConfig, run_python
from jaxrl_llm.tools.sandbox_fusion import parse_response


class FakeSandboxFusion(http.server.BaseHTTPRequestHandler):
    requests: typing.ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeSandboxFusion.requests.append((self.path, body))
        code = body["code"]
        if "boom" in code:
            self.send_response(500)
            self.end_headers()
            return
        if "sleep" in code:
            run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
            reply = {"status": "Failed", "message": "", "run_result": run}
        elif "raise" in code:
            run = {
                "status": "Finished",
                "return_code": 1,
                "stdout": "",
                "stderr": "Traceback...\nValueError: bad\n",
                "execution_time": 0.01,
            }
            reply = {"status": "Failed", "message": "", "run_result": run}
        else:
            run = {
                "status": "Finished",
                "return_code": 0,
                "stdout": "hello\n",
                "stderr": "",
                "execution_time": 0.01,
            }
            reply = {
                "status": "Success",
                "message": "",
                "compile_result": None,
                "run_result": run,
                "files": {},
            }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSandboxFusion)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    FakeSandboxFusion.requests = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_run_code_request_and_success(server):
    config = SandboxConfig(backend="sandbox_fusion", sandbox_fusion_url=server)
    result = run_python("print('hello')", timeout_s=3, memory_mb=512, config=config)
    assert result.ok and result.stdout == "hello\n" and result.backend == "sandbox_fusion"
    path, body = FakeSandboxFusion.requests[0]
    assert path == "/run_code"
    assert body["language"] == "python" and body["code"] == "print('hello')"
    assert body["run_timeout"] == 3 and body["memory_limit_MB"] == 512


def test_errors_timeouts_and_server_failures(server):
    config = SandboxConfig(backend="sandbox_fusion", sandbox_fusion_url=server)
    failed = run_python("raise ValueError('bad')", config=config)
    assert failed.exit_code == 1 and failed.stderr.endswith("ValueError: bad\n")
    slow = run_python("import time; time.sleep(100)", config=config)
    assert slow.timed_out and not slow.ok
    broken = run_python("boom", config=config)
    assert broken.sandbox_error and "500" in broken.sandbox_error and not broken.ok


def test_unreachable_server_is_a_result_not_an_exception():
    config = SandboxConfig(backend="sandbox_fusion", sandbox_fusion_url="http://127.0.0.1:9")
    result = run_python("print(1)", config=config)
    assert result.exit_code is None and "request failed" in result.sandbox_error


def test_parse_response_handles_sandbox_errors_and_caps_output():
    config = SandboxConfig(max_output_bytes=20)
    error = parse_response({"status": "SandboxError", "message": "no runner"}, config=config)
    assert error.sandbox_error == "no runner"
    big = {
        "status": "Success",
        "run_result": {"status": "Finished", "return_code": 0, "stdout": "x" * 1000, "stderr": ""},
    }
    result = parse_response(big, config=config)
    assert result.output_truncated and len(result.stdout) < 100
