"""The environment a run's episodes use, from `RolloutConfig.env`: `env_factory`.

"none" (no environment), a built-in (`BUILTIN_ENVS`: "arithmetic") or the import path of a
factory, "package.module:factory", that takes no arguments (settings from gin) and returns
an object with the `Environment` contract (`agents/env.py`). The contract is checked at
start-up (when the rollout stage is built), on a first environment that is then closed, so
a wrong factory fails before the first step.

A factory that also has `close()` owns what its episodes share (`SharedEnvFactory`: a
sandbox pool, a retriever, a client, built once); the rollout stage calls it when the run
ends or fails, as it closes a tool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from jaxrl_llm.agents.env import Environment
from jaxrl_llm.config_checks import ConfigError, PluginContractError

NO_ENV = "none"
R = TypeVar("R")


class SharedEnvFactory(Generic[R]):
    """An environment factory whose episodes share one resource:

        make_env = SharedEnvFactory(open_pool, lambda pool: SandboxEnv(pool))

    `open()` builds the resource on the first call (at start-up: the contract check's),
    `make_env(resource)` builds each episode's environment with it, and `close()` releases
    it once (its `close()`, if any) when the run ends; a call after `close` is an error.
    Episodes must not close the shared resource themselves."""

    def __init__(self, open: Callable[[], R], make_env: Callable[[R], Environment]):
        self._open, self._make_env = open, make_env
        self._lock = threading.Lock()
        self._resource: R | None = None
        self._closed = False

    def __call__(self) -> Environment:
        with self._lock:
            if self._closed:
                raise RuntimeError("this SharedEnvFactory is closed: its run has ended")
            if self._resource is None:
                self._resource = self._open()
            resource = self._resource
        return self._make_env(resource)

    def close(self) -> None:
        """Release the shared resource (once; later calls do nothing)."""
        with self._lock:
            resource, self._resource, self._closed = self._resource, None, True
        close = getattr(resource, "close", None)
        if callable(close):
            close()


def _arithmetic() -> Environment:
    from jaxrl_llm.agents.arithmetic import ArithmeticEnv

    return ArithmeticEnv()


BUILTIN_ENVS: dict[str, Callable[[], Environment]] = {"arithmetic": _arithmetic}


def check_env_name(name: str) -> None:
    """A clear error for a name that is neither "none", a built-in nor a "module:factory"."""
    if name != NO_ENV and ":" not in name and name not in BUILTIN_ENVS:
        raise ConfigError(
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
            raise PluginContractError(
                f"rollout.env = {name!r} returned a {type(probe).__name__} without the "
                f"environment contract (agents/env.py); missing: {missing}"
            )
    except BaseException:
        shared = getattr(factory, "close", None)  # what its episodes would have shared
        if callable(shared):
            shared()
        raise
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            close()
    return factory
