"""Tools the policy calls during rollouts: the protocol, the Python sandbox, search."""

from jaxrl_llm.tools.executor import PythonExecutor, run_python_many
from jaxrl_llm.tools.protocol import Tool, observe_many
from jaxrl_llm.tools.python_tool import (
    PythonTool,
    any_code_failed,
    format_observation,
    truncate_middle,
)
from jaxrl_llm.tools.sandbox import ExecResult, SandboxConfig, run_python

__all__ = [
    "ExecResult",
    "PythonExecutor",
    "PythonTool",
    "SandboxConfig",
    "Tool",
    "any_code_failed",
    "format_observation",
    "observe_many",
    "run_python",
    "run_python_many",
    "truncate_middle",
]
