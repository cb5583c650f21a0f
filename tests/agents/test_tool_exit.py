"""A tool that ends with a `BaseException` that is not an `Exception` (`sys.exit` in a CLI
wrapper or a library, a `KeyboardInterrupt` or `GeneratorExit` the tool raises itself) is
answered as an error message and counted, as any raise is: it does not end the rollout. The
caller's own Ctrl-C, which arrives in the main thread while the tool runs, still stops it."""

import subprocess
import sys
import time

import pytest

from jaxrl_llm.agents import ParsedTurn, ToolBox, ToolCall


def run_cli(args: str) -> str:
    """Run a small CLI that exits on bad input, as argparse does.

    Args:
        args: Its command line.
    """
    if args == "interrupt":
        raise KeyboardInterrupt
    if args == "generator":
        raise GeneratorExit
    sys.exit(f"usage: cli [-h] (got {args!r})")


def nap(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        ("--bad", "Error: run_cli raised SystemExit: usage: cli [-h] (got '--bad')"),
        ("interrupt", "Error: run_cli raised KeyboardInterrupt: "),
        ("generator", "Error: run_cli raised GeneratorExit: "),
    ],
)
def test_a_tool_that_exits_is_an_error_message(args, answer):
    box = ToolBox([run_cli], timeout_s=5)
    turn = ParsedTurn("", (ToolCall("run_cli", {"args": args}),))
    assert box.answer(turn) == [{"role": "tool", "name": "run_cli", "content": answer}]
    metrics = box.metrics()
    assert (metrics["tools/run_cli/calls"], metrics["tools/run_cli/errors"]) == (1.0, 1.0)


_CALLER_INTERRUPTED = """
import _thread, signal, threading
from jaxrl_llm.agents import ToolBox, ToolCall

# A child inherits an ignored SIGINT (a test worker's), and then Python installs no handler
# of its own, so interrupt_main does nothing: set the one a terminal's Ctrl-C meets.
signal.signal(signal.SIGINT, signal.default_int_handler)

running, interrupted = threading.Event(), threading.Event()

def wait_for_ctrl_c() -> str:
    \"\"\"Return once the caller has been interrupted.

    Returns:
        "done".
    \"\"\"
    running.set()
    assert interrupted.wait(30), "no Ctrl-C came"
    return "done"

def press_ctrl_c() -> None:
    assert running.wait(30), "the tool never ran"  # the caller is inside ToolBox.call
    _thread.interrupt_main()  # seen by the main thread when it next runs Python code:
    interrupted.set()  # still inside ToolBox.call, which waits for the tool

threading.Thread(target=press_ctrl_c).start()
try:
    answer = ToolBox([wait_for_ctrl_c], timeout_s=60).call(ToolCall("wait_for_ctrl_c", {}))
except KeyboardInterrupt:
    print("interrupted")
else:
    print("answered", answer)
"""


@pytest.mark.slow  # measured: 6.2 s (fast tier, AMD EPYC, 2026-12-06)
def test_the_callers_own_interrupt_still_stops_the_call():
    """Ctrl-C in the caller's main thread while the tool runs stops the call (a fix that
    caught every BaseException answered "Error: ... KeyboardInterrupt" instead). In a process
    of its own: a test worker's SIGINT handling is its runner's (under xdist the interrupt
    ended the worker, and a worker's child inherits an ignored SIGINT), and ordered by an
    event, not by time (a 0.2 s timer against a 1 s nap
    failed on a loaded 2-core host)."""
    out = subprocess.run([sys.executable, "-c", _CALLER_INTERRUPTED], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.stdout.strip() == "interrupted", out.stdout + out.stderr[-2000:]
