"""`bench/remote_tool.py`: ToRL's Python tool behind a simulated remote round trip, built from
its benchmark config as a run builds its tool."""

import time

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.tools.factory import build_tool
from jaxrl_llm.tools.python_tool import PythonTool

ASK = "```python\nprint(6 * 7)\n```\n```output"


def test_the_benchmark_config_builds_the_python_tool_with_its_round_trip():
    parse_gin(["bench_torl_remote.gin"], ["remote_python.latency_s = 0.2"])
    tool = build_tool(RLConfig().rollout.tool)
    assert tool is not None and tool.name == "python"
    assert tool.stop_strings == PythonTool().stop_strings
    t0 = time.perf_counter()
    answer = tool(ASK)
    assert time.perf_counter() - t0 >= 0.2  # the answer waits for the round trip
    assert answer == PythonTool()(ASK) == "\n42\n```\n"
    assert tool("no code here") is None
    assert tool.response_metrics([ASK + answer]) == {"env/code_success_rate": 1.0}


def test_a_negative_latency_is_refused():
    from jaxrl_llm.bench.remote_tool import remote_python

    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        remote_python(latency_s=-1)
