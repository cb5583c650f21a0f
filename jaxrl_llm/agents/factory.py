"""The environment a run's episodes use, from `RolloutConfig.env`: `env_factory`.

"none" (no environment), a built-in (`BUILTIN_ENVS`: "arithmetic") or the import path of a
factory, "package.module:factory", that takes no arguments (settings from gin) and returns
an object with the `Environment` contract (`agents/env.py`). The contract is checked at
start-up (when the rollout stage is built), on a first environment that is then closed, so
a wrong factory fails before the first step.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxrl_llm.agents.env import Environment

NO_ENV = "none"


def _arithmetic() -> Environment:
    from jaxrl_llm.agents.arithmetic import ArithmeticEnv

    return ArithmeticEnv()


BUILTIN_ENVS: dict[str, Callable[[], Environment]] = {"arithmetic": _arithmetic}


def check_env_name(name: str) -> None:
    """A clear error for a name that is neither "none", a built-in nor a "module:factory"."""
    if name != NO_ENV and ":" not in name and name not in BUILTIN_ENVS:
        raise ValueError(
            f"rollout.env = {name!r}: expected 'none', one of {', '.join(BUILTIN_ENVS)} or an "
            "import path 'package.module:factory'"
        )


def env_factory(name: str) -> Callable[[], Environment]:
    """The factory `name` refers to; its first environment is checked against the contract
    here, at start-up (then closed)."""
    from jaxrl_llm.tools.factory import resolve_import_path

    check_env_name(name)
    factory = BUILTIN_ENVS.get(name) or resolve_import_path(name, "rollout.env")
    probe = factory()
    try:
        if not isinstance(probe, Environment):
            missing = [a for a in ("tools", "reset", "step", "close") if not hasattr(probe, a)]
            raise TypeError(
                f"rollout.env = {name!r} returned a {type(probe).__name__} without the "
                f"environment contract (agents/env.py); missing: {missing}"
            )
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            close()
    return factory
