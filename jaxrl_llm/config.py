"""gin wiring: `--gin_file` / `--gin_param` flags, config lookup, the resolved config file.

Configs are frozen dataclasses registered with `gin.configurable`; gin files only override
them. An unknown configurable or parameter fails at parse time, before anything compiles;
a wrong value fails when its dataclass is built (`config_checks.checked_fields`).

The shipped gin files live in the repository's top-level `configs/` and are installed as the
package data `jaxrl_llm.configs` (`pyproject.toml` maps the one to the other, for editable
and regular installs alike), so an installed package finds them wherever it runs.
`--gin_file` takes a path, a shipped file's name (`ppo_tiny.gin`, or `ppo_tiny`), or the
`configs/ppo_tiny.gin` form the files' header comments print: a path that exists is used as
given, otherwise its last component is looked up among the shipped files.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from tokenize import TokenError

import gin
from gin import config as gin_config

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.config_record import write_resolved_config as write_resolved_config

__all__ = [
    "CONFIGS_DIR",
    "ConfigError",
    "add_gin_arguments",
    "parse_gin",
    "resolve_gin_file",
    "write_resolved_config",
]

CONFIGS_DIR = Path(str(importlib.resources.files("jaxrl_llm.configs")))


def add_gin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gin_file", action="append", default=[], help="gin config file (repeatable)"
    )
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="gin binding, e.g. --gin_param='OptimConfig.lr=1e-5' (repeatable)",
    )


def resolve_gin_file(name: str | os.PathLike) -> Path:
    """`name` if it is a file, else the shipped config of that name (`.gin` optional).

    Only a bare name or `configs/<name>` falls back to the shipped files: a missing file at
    any other path is an error, not silently a shipped config of the same name.
    """
    path = Path(name)
    if path.is_file():
        return path
    if path.parent not in (Path(), Path("configs")):
        raise ConfigError(f"gin file {str(name)!r} not found")
    for candidate in (CONFIGS_DIR / path.name, CONFIGS_DIR / f"{path.name}.gin"):
        if candidate.is_file():
            return candidate
    shipped = ", ".join(sorted(p.name for p in CONFIGS_DIR.glob("*.gin")))
    raise ConfigError(
        f"gin file {str(name)!r} not found: not a file, and no shipped config named "
        f"{path.name!r} (shipped: {shipped})"
    )


def parse_gin(files: Sequence[str | os.PathLike] = (), params: Sequence[str] = ()) -> None:
    """Clear previous bindings, then parse `files` and `params` (params win)."""
    gin.clear_config()
    _register_configurables()
    paths = [str(resolve_gin_file(f)) for f in files]
    gin.add_config_file_search_path(str(CONFIGS_DIR))
    # gin logs "Path not found" (at ERROR, on the root logger) for every include it then
    # finds on the search path; only a truly missing include is an error, and it raises.
    quiet = _DropMessages("Path not found:", "system_path_file_exists:")
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        gin.parse_config_files_and_bindings(paths, list(params), finalize_config=False)
    except (ValueError, KeyError, TypeError, SyntaxError, OSError, ImportError, TokenError) as e:
        raise ConfigError(f"bad gin configuration: {_one_line(e)}") from e
    finally:
        root.removeFilter(quiet)
    _check_macros()


def _one_line(error: BaseException) -> str:
    """gin's message, its location lines ("In bindings string line 1", the line) after it in
    parentheses: one line, as the command line prints a configuration error."""
    text = error.args[0] if isinstance(error, KeyError | TokenError) and error.args else error
    first, *where = [line.strip() for line in str(text).splitlines() if line.strip()] or [""]
    return f"{first} ({'; '.join(where)})" if where else first


def _check_macros() -> None:
    """Every `%MACRO` a binding uses is defined: gin only finds out when the configurable that
    holds it is built, with a TypeError from deep in the run."""
    bindings = gin_config._CONFIG  # pyright: ignore[reportPrivateUsage]  # no public reader
    defined = {scope for scope, selector in bindings if selector == "gin.macro"}
    for ref in gin_config.iterate_references(bindings):
        configurable, name = ref.configurable, "/".join(ref.scopes)
        if configurable is None or configurable.selector != "gin.macro" or name in defined:
            continue
        raise ConfigError(
            f"bad gin configuration: macro %{name} is used but never defined; define it "
            f"('{name} = ...') or fix its spelling"
        )


def _register_configurables() -> None:
    """Import the modules whose dataclasses gin files configure (registration is import)."""
    import jaxrl_llm.agents.env
    import jaxrl_llm.learner.rl_config
    import jaxrl_llm.learner.sft
    import jaxrl_llm.metrics.writer
    import jaxrl_llm.tools.search  # noqa: F401


class _DropMessages(logging.Filter):
    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)
