"""This user's cache folder for the project: `$XDG_CACHE_HOME/jaxrl-llm/<name>`, else
`~/.cache/jaxrl-llm/<name>`. The XLA compilation cache (`cli.compile_cache`) and the int8
CPU kernel's builds (`models.int8_cpu`) live there."""

import os
from collections.abc import Mapping


def user_cache_dir(name: str, env: Mapping[str, str] = os.environ) -> str:
    """The folder `name` of the project's cache (not created here)."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxrl-llm", name)
