"""The built-in tools as a table (what each needs from `RolloutConfig`), and the capabilities
the rollout asks of a tool object instead of its name (`protocol.ReportsMetrics`)."""

import dataclasses
from types import SimpleNamespace

import gin
import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.tasks import builtin_task
from jaxrl_llm.learner.rl_config import DataConfig, RLConfig, RolloutConfig
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.tools import PythonTool, build_tool
from jaxrl_llm.tools.factory import BUILTIN_TOOLS, missing_requirement
from jaxrl_llm.tools.protocol import ReportsMetrics, Tool
from jaxrl_llm.tools.search import SearchConfig, SearchTool

GOOD = "```python\nprint(1)\n```\n```output\n1\n```\n"
BAD = "```python\n1/0\n```\n```output\nZeroDivisionError: division by zero\n```\n"


def test_builtin_tools_declare_the_settings_they_need():
    assert list(BUILTIN_TOOLS) == ["none", "python", "search"]
    assert {n: dict(t.requires) for n, t in BUILTIN_TOOLS.items()} == {
        "none": {},
        "python": {},
        "search": {"SearchConfig.corpus": "a jsonl corpus"},
    }
    need = "rollout.tool='search' needs SearchConfig.corpus (a jsonl corpus)"
    assert missing_requirement("search", {"SearchConfig.corpus": None}) == need
    assert missing_requirement("search", {"SearchConfig.corpus": "c.jsonl"}) is None
    assert missing_requirement("pkg.mod:factory", {}) is None  # a plug-in declares nothing
    with pytest.raises(ValueError, match=r"needs SearchConfig.corpus \(a jsonl corpus\)"):
        build_tool("search")
    with pytest.raises(ValueError, match=r"'calc': expected one of none, python, search or"):
        build_tool("calc")
    # the built-in task that supplies a setting names it as the tool requires it
    assert set(builtin_task("retrieval").supplies) == set(BUILTIN_TOOLS["search"].requires)


def test_validation_asks_the_tool_and_the_task_for_the_corpus():
    search = RolloutConfig(tool="search")
    with pytest.raises(ValueError, match=r"rollout.tool='search' needs SearchConfig.corpus"):
        RLConfig(rollout=search, data=DataConfig(train_file="t.jsonl")).validate()
    with pytest.raises(ValueError, match=r"rollout.tool='search' needs SearchConfig.corpus"):
        RLConfig(rollout=search, data=DataConfig(builtin_task="arithmetic")).validate()
    # the built-in retrieval task writes the corpus the search tool reads
    RLConfig(rollout=search, data=DataConfig(builtin_task="retrieval")).validate()
    gin.bind_parameter("SearchConfig.corpus", "c.jsonl")
    try:
        RLConfig(rollout=search, data=DataConfig(train_file="t.jsonl")).validate()
    finally:
        gin.clear_config()


def test_the_search_tool_reads_its_own_config(tmp_path):
    from jaxrl_llm.data.tasks import retrieval

    paths = retrieval.write_task(tmp_path, n_train=10, n_val=2)
    with pytest.raises(ConfigError, match=r"SearchConfig\.k"):
        SearchConfig(k=0)
    gin.bind_parameter("SearchConfig.k", 1)
    try:
        tool = build_tool("search", corpus=paths["corpus"])  # the task's corpus
        assert isinstance(tool, SearchTool) and tool.k == 1
        gin.bind_parameter("SearchConfig.corpus", "missing.jsonl")  # its own comes first
        with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
            build_tool("search", corpus=paths["corpus"])
    finally:
        gin.clear_config()


@dataclasses.dataclass
class Echo:
    """A plug-in tool without metrics, named like the built-in Python tool."""

    name: str = "python"
    stop_strings: tuple[str, ...] = ("</echo>",)

    def __call__(self, text):
        return None


def _env_metrics(tool, texts):
    comps = [SimpleNamespace(text=t, tool_calls=1, finish_reason="eos") for t in texts]
    return RolloutStage.env_metrics(SimpleNamespace(tool=tool), SimpleNamespace(completions=comps))  # pyright: ignore[reportArgumentType]


def test_tool_metrics_come_from_the_tool_not_its_name():
    python = PythonTool()
    assert isinstance(python, ReportsMetrics) and isinstance(python, Tool)
    assert python.response_metrics([GOOD + BAD, GOOD, "no code"]) == {
        "env/code_success_rate": pytest.approx(2 / 3)
    }
    assert python.response_metrics(["no code"]) == {"env/code_success_rate": 0.0}
    assert _env_metrics(python, [GOOD, BAD])["env/code_success_rate"] == 0.5
    echo = Echo()
    assert isinstance(echo, Tool) and not isinstance(echo, ReportsMetrics)
    assert "env/code_success_rate" not in _env_metrics(echo, [GOOD, BAD])
