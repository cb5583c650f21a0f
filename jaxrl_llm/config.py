"""gin wiring: `--gin_file` / `--gin_param` flags, config lookup, the resolved config file.

Configs are frozen dataclasses registered with `gin.configurable`; gin files only override
them. An unknown configurable or parameter fails at parse time, before anything compiles.
Files are looked up as given, then under the repository's `configs/` folder, so
`--gin_file=grpo_tiny.gin` works from any directory.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import gin

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A gin file or binding is wrong (unknown key, bad value, missing file)."""


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
    path = Path(name)
    for candidate in (path, CONFIGS_DIR / path, CONFIGS_DIR / f"{path}.gin"):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"gin file {str(name)!r} not found (also looked in {CONFIGS_DIR})")


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
    except (ValueError, KeyError, TypeError, SyntaxError, OSError) as e:
        raise ConfigError(f"bad gin configuration: {e}") from e
    finally:
        root.removeFilter(quiet)


def _register_configurables() -> None:
    """Import the modules whose dataclasses gin files configure (registration is import)."""
    import jaxrl_llm.learner.rl_config
    import jaxrl_llm.learner.sft  # noqa: F401


class _DropMessages(logging.Filter):
    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def write_resolved_config(run_dir: str | os.PathLike) -> Path:
    """Write the operative config (every parameter used, defaults included) to config.gin.

    Call it after the config objects are built: gin records a value when it is used.
    """
    path = Path(run_dir) / "config.gin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(gin.operative_config_str())
    return path
