"""The ToRL tool: block extraction, output format and truncation, parallel execution."""

import time

import pytest

from jaxrl_llm.tools import (
    ExecResult,
    PythonExecutor,
    PythonTool,
    SandboxConfig,
    Tool,
    any_code_failed,
    format_observation,
    run_python_many,
    truncate_middle,
)
from jaxrl_llm.tools.python_tool import format_result, is_error_output, last_code_block

pytestmark = pytest.mark.filterwarnings("ignore:SANDBOX IS WEAK")


def test_truncate_middle_is_torl_truncation():
    assert truncate_middle("a" * 256) == "a" * 256
    text = "".join(chr(65 + i % 26) for i in range(300))
    out = truncate_middle(text)
    assert out == text[:128] + "..." + text[-128:] and len(out) == 259


def test_last_code_block_takes_the_last_and_unclosed_blocks():
    text = "```python\nprint(1)\n```\n```output\n1\n```\nthen\n```python\nx = 2\nprint(x)\n```\n"
    assert last_code_block(text) == "x = 2\nprint(x)\n"
    assert last_code_block("```python\nprint(3)\n") == "print(3)\n"
    assert last_code_block("no code here") is None


def test_format_result_success_error_timeout():
    ok = ExecResult("4\n", "", 0, False)
    assert format_observation(ok) == "```output\n4\n```\n"
    err = ExecResult(
        "partial\n", "Traceback (most recent call last):\n  ...\nKeyError: 'a'\n", 1, False
    )
    assert format_result(err) == "partial\nKeyError: 'a'"
    slow = ExecResult("", "", -9, True)
    assert format_result(slow).startswith("TimeoutError")
    long_out = ExecResult("x" * 1000, "", 0, False)
    assert format_result(long_out) == "x" * 128 + "..." + "x" * 128
    long_error = ExecResult("", "ValueError: " + "y" * 500, 1, False)
    assert (
        format_result(long_error).startswith("ValueError: ")
        and len(format_result(long_error)) == 259
    )


def test_any_code_failed_reads_output_blocks():
    good = "```python\nprint(1)\n```\n```output\n1\n```\nSo \\boxed{1}."
    bad = good + "\n```python\n1/0\n```\n```output\nZeroDivisionError: division by zero\n```\n"
    timeout = "```output\nTimeoutError: code execution timed out\n```"
    assert not any_code_failed(good) and any_code_failed(bad) and any_code_failed(timeout)
    assert not any_code_failed("The Error: in my reasoning is absent")
    assert any_code_failed("```output\nTraceback (most recent call last):\n  File x\n```")
    assert not any_code_failed("```output\nError rate 5%\n```")


def test_python_tool_observes_and_skips_executed_blocks():
    """The driver's contract: the text ends with the stop string generation stopped on."""
    tool = PythonTool(SandboxConfig(timeout_s=5))
    assert isinstance(tool, Tool) and tool.stop_strings == ("```output",)
    text = "Compute.\n```python\nprint(6 * 7)\n```\n```output"
    observation = tool(text)
    assert observation == "\n42\n```\n" and tool(text) == observation
    assert tool(text + observation + "Again.```output") is None  # that block already ran
    assert tool("Compute.\n```python\nprint(6 * 7)\n```\n") is None  # not at the stop
    assert tool("no code```output") is None
    failing = tool("```python\nundefined_name\n```\n```output")
    assert failing == "\nNameError: name 'undefined_name' is not defined\n```\n"


def test_runs_in_parallel_without_blocking():
    codes = [f"import time; time.sleep(0.5); print({i})" for i in range(8)]
    run_python_many(["pass"], timeout_s=5, max_workers=1)  # the sandbox's one-time probe
    start = time.monotonic()
    results = run_python_many(codes, timeout_s=5, max_workers=8)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert elapsed < 8 * 0.5 * 0.6, elapsed  # well under the serial time of 4 s
    with PythonExecutor(SandboxConfig(timeout_s=5), max_workers=4) as executor:
        future = executor.submit("import time; time.sleep(2); print('done')")
        assert not future.done()  # submit returned while the program runs
        assert future.result().stdout == "done\n"


def _tool_turn(tool: PythonTool, code: str) -> str:
    """A response with one tool turn on `code`, then a final answer."""
    response = "Let me compute.\n```python\n" + code + "\n```\n```output"
    observation = tool(response)
    assert observation is not None
    return response + observation + "So \\boxed{3}."


@pytest.mark.parametrize("fence", ["`" * 3, "`" * 4, "`" * 6, "``` ```"])
def test_program_output_cannot_close_its_output_block(fence):
    """A program that prints a fence before failing still shows as failed: no run of three
    backticks of its output reaches the response, so the tool's own fence ends the block."""
    tool = PythonTool(SandboxConfig(timeout_s=5))
    full = _tool_turn(tool, f"print({fence!r})\n1/0")
    assert any_code_failed(full)
    assert tool.response_metrics([full]) == {"env/code_success_rate": 0.0}
    observation = full[full.index("```output") + len("```output") : full.index("So \\boxed")]
    assert observation.count("```") == 1 and observation.endswith("\n```\n")
    error = ExecResult(fence + "\n", f"ValueError: {fence}\n", 1, False)
    assert "```" not in format_result(error) and any_code_failed(format_observation(error))


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(3)",
        "import os\nos.kill(os.getpid(), 9)",
        "import ctypes\nctypes.string_at(0)",
        "import os\nos.abort()",
        "import sys\nsys.exit('done')",  # a last stderr line that names no error
        "import os, sys\nprint('all good', file=sys.stderr)\nos._exit(1)",
    ],
    ids=["exit3", "sigkill", "segfault", "abort", "exit-message", "stderr-then-exit"],
)
def test_a_failed_run_always_reads_as_failed(code):
    """However a run fails (exit status, signal, a stderr line of its own), its output block
    ends with a line `is_error_output` recognises, so the code penalty applies."""
    tool = PythonTool(SandboxConfig(timeout_s=5))
    full = _tool_turn(tool, code)
    assert any_code_failed(full), full
    assert tool.response_metrics([full]) == {"env/code_success_rate": 0.0}
    assert format_result(ExecResult("", "", 3, False)) == "Error: exit code 3"
    assert is_error_output("Error: exit code 139")
