"""A tool that ends with a `BaseException` that is not an `Exception` (`sys.exit` in a CLI
wrapper or a library, a `KeyboardInterrupt` or `GeneratorExit` the tool raises itself) is
answered as an error message and counted, as any raise is: it does not end the rollout. The
caller's own Ctrl-C, which arrives in the main thread while the tool runs, still stops it."""

import _thread
import sys
import threading
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


def test_the_callers_own_interrupt_still_stops_the_call():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a Ctrl-C is delivered to the main thread only")
    box = ToolBox([nap], timeout_s=5)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            box.call(ToolCall("nap", {"seconds": 1.0}))
    finally:
        timer.cancel()
