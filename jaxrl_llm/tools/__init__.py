"""Tools the policy calls during rollouts: the protocol, the Python sandbox, search, and
plug-ins by import path (`build_tool`; docs/agents.md)."""

from jaxrl_llm.tools.executor import PythonExecutor, run_python_many
from jaxrl_llm.tools.factory import build_tool
from jaxrl_llm.tools.protocol import Tool
from jaxrl_llm.tools.python_tool import (
    PythonTool,
    any_code_failed,
    format_observation,
    truncate_middle,
)
from jaxrl_llm.tools.sandbox import SandboxUnavailable, bwrap_available, run_python
from jaxrl_llm.tools.sandbox_types import ExecResult, SandboxConfig
from jaxrl_llm.tools.search import BM25Retriever, SearchTool, make_search_tool

__all__ = [
    "BM25Retriever",
    "ExecResult",
    "PythonExecutor",
    "PythonTool",
    "SandboxConfig",
    "SandboxUnavailable",
    "SearchTool",
    "Tool",
    "any_code_failed",
    "build_tool",
    "bwrap_available",
    "format_observation",
    "make_search_tool",
    "run_python",
    "run_python_many",
    "truncate_middle",
]
