"""Rollout: JetStream-API engine, sampling, KV cache management, RL rollout driver, and the
sampler seam the RL loop samples through (`sampler.py`: our engine or vLLM behind it).

Names are imported lazily: the engine imports `jetstream.engine.engine_api`, which pulls in
seqio and TensorFlow (seconds and hundreds of MB), so `import jaxrl_llm.rollout` stays light
and the cost is paid on first use of `Engine`, `RolloutDriver` or `generate`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what checkers see; at run time `__getattr__` imports on first use
    from jaxrl_llm.rollout.completions import pad_completions
    from jaxrl_llm.rollout.driver import RolloutDriver, generate
    from jaxrl_llm.rollout.engine import Engine
    from jaxrl_llm.rollout.records import DecodeState, ParamsRef, Prefix
    from jaxrl_llm.rollout.sampling import SamplingParams, sample_tokens
    from jaxrl_llm.types import Completion

_EXPORTS = {
    "Engine": "jaxrl_llm.rollout.engine",
    "ParamsRef": "jaxrl_llm.rollout.records",
    "Prefix": "jaxrl_llm.rollout.records",
    "DecodeState": "jaxrl_llm.rollout.records",
    "RolloutDriver": "jaxrl_llm.rollout.driver",
    "Completion": "jaxrl_llm.types",
    "generate": "jaxrl_llm.rollout.driver",
    "pad_completions": "jaxrl_llm.rollout.completions",
    "SamplingParams": "jaxrl_llm.rollout.sampling",
    "sample_tokens": "jaxrl_llm.rollout.sampling",
}

__all__ = [  # sorted(_EXPORTS), written out for checkers
    "Completion",
    "DecodeState",
    "Engine",
    "ParamsRef",
    "Prefix",
    "RolloutDriver",
    "SamplingParams",
    "generate",
    "pad_completions",
    "sample_tokens",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
