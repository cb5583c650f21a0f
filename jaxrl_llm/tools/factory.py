"""The tool a rollout uses, from its config name: `build_tool`.

`RolloutConfig.tool` is "none", a built-in ("python": ToRL's code interpreter, "search":
Search-R1's BM25 retriever) or the import path of a factory, "package.module:factory".
A factory takes no arguments and returns an object with the `Tool` contract
(`tools/protocol.py`); its own settings come from gin (make it `@gin.configurable`) or
from its module. The object is checked here, at start-up, so a wrong factory fails before
any model loads. See docs/tools.md.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_llm.tools.protocol import Tool

BUILTIN_TOOLS = ("none", "python", "search")


def check_tool_name(name: str) -> None:
    """A clear error for a name that is neither a built-in nor a "module:factory" path."""
    if name not in BUILTIN_TOOLS and ":" not in name:
        raise ValueError(
            f"rollout.tool = {name!r}: expected one of {BUILTIN_TOOLS} or an import path "
            "'package.module:factory'"
        )


def build_tool(
    name: str, *, search_corpus: str | Path | None = None, search_k: int = 3
) -> Tool | None:
    """The tool `name` refers to (None for "none"). `search_corpus`/`search_k`: the
    built-in search tool's corpus (jsonl) and passages per query."""
    check_tool_name(name)
    if name == "none":
        return None
    if name == "python":
        from jaxrl_llm.tools.python_tool import PythonTool

        return PythonTool()
    if name == "search":
        from jaxrl_llm.tools.search import make_search_tool

        if search_corpus is None:
            raise ValueError("rollout.tool='search' needs rollout.search_corpus (a jsonl corpus)")
        return make_search_tool(search_corpus, k=search_k)
    return _plugin_tool(name)


def resolve_import_path(spec: str, setting: str) -> Callable[..., Any]:
    """The callable at "package.module:attribute" (`pkgutil.resolve_name`), with an error
    naming `setting` (e.g. "rollout.tool") and how to make the module importable."""
    try:
        obj = pkgutil.resolve_name(spec)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(
            f"{setting} = {spec!r}: cannot import it ({type(e).__name__}: {e}). The module "
            "must be importable by the trainer and its worker processes: install its "
            "package (pip install -e .) or put its folder on PYTHONPATH"
        ) from e
    if not callable(obj):
        raise TypeError(f"{setting} = {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def _plugin_tool(name: str) -> Tool:
    factory = resolve_import_path(name, "rollout.tool")
    tool = factory()
    if not isinstance(tool, Tool):
        missing = [
            a for a in ("name", "stop_strings", "__call__", "observe") if not hasattr(tool, a)
        ]
        raise TypeError(
            f"rollout.tool = {name!r} returned a {type(tool).__name__} without the tool "
            f"contract (tools/protocol.py); missing: {missing}"
        )
    stops = tool.stop_strings
    if (
        not isinstance(stops, tuple)
        or not stops
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise TypeError(
            f"rollout.tool = {name!r}: stop_strings must be a non-empty tuple of non-empty "
            f"strings (where generation pauses for the tool), got {stops!r}"
        )
    return tool
