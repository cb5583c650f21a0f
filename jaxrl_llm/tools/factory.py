"""The tool a rollout uses, from its config name: `build_tool`, over a table of built-ins.

`RolloutConfig.tool` is a built-in's name (`BUILTIN_TOOLS`: "none", "python": ToRL's code
interpreter, settings in `SandboxConfig`; "search": Search-R1's BM25 retriever, settings in
`SearchConfig`) or the import path of a factory,
"package.module:factory". A factory takes no arguments, or a `tokenizer` keyword (the
policy's: a chat-format tool renders its observations with the checkpoint's template,
`agents.ChatToolUse`), and returns an object with the `Tool` contract (`tools/protocol.py`);
its own settings come from gin (make it `@gin.configurable`) or from its module. The object
is checked here, when the rollout stage is built, so a wrong factory fails before the first
step. What a
built-in needs from the config (`BuiltinTool.requires`) is declared in its entry, so
validation asks the table rather than comparing names. See docs/agents.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxrl_llm.config_checks import PluginContractError, PluginImportError
from jaxrl_llm.tools.protocol import Tool, turn_rules
from jaxrl_llm.tools.special_tokens import special_token_strings

NO_TOOL = "none"
CORPUS = "SearchConfig.corpus"  # the one setting a built-in tool requires


@dataclasses.dataclass(frozen=True)
class BuiltinTool:
    """A built-in tool: how to build it and what it needs from `RolloutConfig`.

    `build` takes, as keywords, the settings it declares (`corpus`: the search corpus, from
    `SearchConfig.corpus` or the built-in task's; `tokenizer`: the policy's, whose
    special-token strings the tool neutralises in the text it returns, `tools.special_tokens`)
    and returns the tool (None: no tool); its other settings it reads from its own gin
    config. `requires` maps the settings that must be
    set (not None or empty), by their gin names, to what they hold, for the error that names
    a missing one.
    """

    build: Callable[..., Tool | None]
    summary: str
    requires: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _no_tool() -> None:
    return None


def _python_tool(*, tokenizer=None) -> Tool:
    from jaxrl_llm.tools.python_tool import PythonTool

    return PythonTool(special_tokens=special_token_strings(tokenizer))


def _search_tool(*, corpus: str | Path, tokenizer=None) -> Tool:
    from jaxrl_llm.tools.search import SearchConfig, make_search_tool

    specials = special_token_strings(tokenizer)
    return make_search_tool(corpus, k=SearchConfig().k, special_tokens=specials)


BUILTIN_TOOLS: dict[str, BuiltinTool] = {
    NO_TOOL: BuiltinTool(_no_tool, "no tool (the default)"),
    "python": BuiltinTool(_python_tool, "ToRL's code interpreter, in the sandbox"),
    "search": BuiltinTool(
        _search_tool,
        "Search-R1's BM25 retriever",
        requires={CORPUS: "a jsonl corpus"},
    ),
}


def builtin_tool(name: str) -> BuiltinTool | None:
    """The built-in `name` names, None for a "module:factory" path; a clear error for a
    name that is neither."""
    if ":" in name:
        return None
    if name not in BUILTIN_TOOLS:
        raise ValueError(
            f"rollout.tool = {name!r}: expected one of {', '.join(BUILTIN_TOOLS)} or an import "
            "path 'package.module:factory'"
        )
    return BUILTIN_TOOLS[name]


def check_tool_name(name: str) -> None:
    """A clear error for a name that is neither a built-in nor a "module:factory" path."""
    builtin_tool(name)


def missing_requirement(name: str, settings: Mapping[str, Any]) -> str | None:
    """The error for the first setting built-in `name` requires that `settings` (gin name ->
    value) leaves unset, e.g. "rollout.tool='search' needs SearchConfig.corpus (a jsonl
    corpus)"; None when nothing is missing or `name` is a plug-in path."""
    spec = builtin_tool(name)
    for setting, what in (spec.requires if spec else {}).items():
        if settings.get(setting) in (None, ""):
            return f"rollout.tool={name!r} needs {setting} ({what})"
    return None


def tool_settings(corpus: str | Path | None = None) -> dict[str, Any]:
    """What the built-in tools may require, by gin name: the search corpus from
    `SearchConfig.corpus`, else `corpus` (the built-in task's, when it writes one)."""
    from jaxrl_llm.tools.search import SearchConfig

    return {CORPUS: SearchConfig().corpus or corpus}


def build_tool(name: str, *, corpus: str | Path | None = None, tokenizer=None) -> Tool | None:
    """The tool `name` refers to (None for "none"). `corpus`: the built-in task's search
    corpus, used when `SearchConfig.corpus` is unset; `tokenizer`: the policy's, for a
    built-in (which neutralises its special-token strings in program output and passages)
    or a plug-in factory that takes it."""
    spec = builtin_tool(name)
    if spec is None:
        return _plugin_tool(name, tokenizer)
    settings = tool_settings(corpus)
    problem = missing_requirement(name, settings)
    if problem:
        raise ValueError(problem)
    offered = {"corpus": settings[CORPUS], "tokenizer": tokenizer}
    declared = inspect.signature(spec.build).parameters
    return spec.build(**{k: v for k, v in offered.items() if k in declared})


def resolve_import_path(spec: str, setting: str) -> Callable[..., Any]:
    """The callable at "package.module:attribute" (`pkgutil.resolve_name`), with an error
    naming `setting` (e.g. "rollout.tool") and how to make the module importable."""
    try:
        obj = pkgutil.resolve_name(spec)
    except (ImportError, AttributeError, ValueError) as e:
        raise PluginImportError(
            f"{setting} = {spec!r}: cannot import it ({type(e).__name__}: {e}). The module "
            "must be importable by the trainer and its worker processes: install its "
            "package (pip install -e .) or put its folder on PYTHONPATH"
        ) from e
    if not callable(obj):
        raise PluginContractError(f"{setting} = {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def _plugin_tool(name: str, tokenizer=None) -> Tool:
    factory = resolve_import_path(name, "rollout.tool")
    wants = "tokenizer" in inspect.signature(factory).parameters
    tool = factory(tokenizer=tokenizer) if wants else factory()
    if not isinstance(tool, Tool):
        missing = [a for a in ("name", "stop_strings", "__call__") if not hasattr(tool, a)]
        raise PluginContractError(
            f"rollout.tool = {name!r} returned a {type(tool).__name__} without the tool "
            f"contract (tools/protocol.py); missing: {missing}"
        )
    stops = tool.stop_strings
    on_eos = turn_rules(tool).on_eos  # its turns end on the end-of-turn token: no stop needed
    if (
        not isinstance(stops, tuple)
        or not (stops or on_eos)
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise PluginContractError(
            f"rollout.tool = {name!r}: stop_strings must be a non-empty tuple of non-empty "
            f"strings (where generation pauses for the tool), got {stops!r}; a tool whose "
            "turns end on the end-of-turn token sets turn_ends_on_eos = True"
        )
    return tool
