"""The sampler seam: what the RL loop needs of a generation backend, and how one is chosen.

    sampler = build_sampler(SamplerContext(cfg=rollout_cfg, policy=..., ...))
    push = sampler.push_weights(trainer_params, version=v)  # WeightPush(bytes, seconds)
    check_version(sampler.policy_version, v)           # what the push delivered
    completions = sampler.generate(prompts, sampling, tool=..., on_finish=...)
    sampler.release()                                  # until the next push
    sampler.metrics(); sampler.close()

`RolloutConfig.backend` names the backend: a built-in (`backends.BACKENDS`: "jax", our paged engine,
the default; "vllm", an in-process `vllm.LLM`) or "package.module:factory". A factory takes
the `SamplerContext` and returns an object with the `Sampler` contract; its own settings
come from its own gin-configurable config (the vLLM backend's is `VllmConfig`), never from
prefixed fields of `RolloutConfig`. `RolloutStage` keeps scoring, the multi-host gather and
the step's metrics, whatever the backend (`rollout/stage.py`).

A backend returns `types.Completion`s prompt-major (completion `p * n + i` is sample i of
prompt p) with the sampled tokens, the per-token logprobs of the sampled tokens under the
distribution sampled from (0 for greedy samples and on tool output), the response mask (0 on
tool output), finish reason, stop string and tool-call count; a tool turn pauses a sample at
one of the stop strings, hands the response so far to `tool(text)` and appends the
observation's tokens (masked) before sampling resumes, as `rollout/driver.py` describes.

Versions: the trainer hands its weights over as `PolicyWeights(params, version)`, the
version bound to the params where they are handed over (`learner/overlap.py`'s copies, the
synchronous loop's live params), and the sampler's `policy_version` is the version that
arrived with the weights it holds: on the JAX engine an int32 that moves in the same
transfer as the params (with LoRA, as the adapters: a lost adapter update leaves the old
version), on vLLM the version of the last push that completed. `RolloutStage.generate(...,
version=v)` refuses to sample (`StaleWeightsError`) unless the sampler holds version v.

Optional: `stage_weights(params, version) -> StagedWeights`, the part of a push that runs
device collectives across hosts, done on the calling thread; `push_weights(staged, version)`
then runs none. A multi-host overlapped run needs it (`learner/overlap.py`); the JAX engine
has it, and a backend without it is refused there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from jaxrl_llm.config_checks import PluginContractError
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.tools.protocol import ToolCallback as ToolCallback  # importable here
from jaxrl_llm.types import Completion

OnFinish = Callable[[int, Completion], object]
Progress = Callable[[int, int], object]


@dataclasses.dataclass(frozen=True)
class WeightPush:
    """What one `push_weights` moved: bytes handed to the sampler and the seconds it took
    (until the sampler can sample with them)."""

    bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class PolicyWeights:
    """The policy's whole State and the version it is (`Rollout.policy_version`: the weights
    after `version - 1` updates), bound where the trainer hands them over."""

    params: Any
    version: int


@dataclasses.dataclass(frozen=True)
class StagedWeights:
    """Weights a backend's optional `stage_weights(params, version)` prepared: the part of
    a push that runs device collectives across hosts is done, on the thread that called it,
    into new buffers (so the trainer may donate its params after), and `push_weights(staged,
    version)` runs none. A multi-host overlapped run needs it: its producer thread pushes
    while the trainer's thread runs the update's collectives (`sharding/hosts.py`,
    "Threads"). `arrays`: the backend's own; `bytes`: what the push moves."""

    arrays: tuple[Any, ...]
    version: int | None
    bytes: int


# A pytree of its arrays, so `jax.block_until_ready` and readiness checks see them.
jax.tree_util.register_dataclass(
    StagedWeights, data_fields=["arrays"], meta_fields=["version", "bytes"]
)


# Partial rollouts: newer weights to continue the samples still decoding with, or None.
Refresh = Callable[[], PolicyWeights | None]


class StaleWeightsError(RuntimeError):
    """The sampler holds other weights than the version a batch is to be sampled with."""


def check_version(held: int | None, wanted: int) -> None:
    """Raise `StaleWeightsError` unless the sampler's weights (`held`) are version `wanted`."""
    if held != wanted:
        what = "no versioned weights" if held is None else f"the weights of version {held}"
        raise StaleWeightsError(
            f"the sampler holds {what}, but this batch is to be sampled with version "
            f"{wanted}: a weight update did not reach the sampler (with LoRA, an adapter "
            "sync lost, skipped or of another tree); sampling now would train on samples "
            "labelled with a policy that did not produce them"
        )


@dataclasses.dataclass(frozen=True)
class SamplerContext:
    """What a backend is built from: the rollout config, the trainer's policy module (its
    architecture, for the JAX engine), the tokenizer, the training mesh, the checkpoint
    folder the policy was loaded from (a server engine loads its own copy from it), the
    longest prompt, the dtype the sampler's weights are cast to (None: the trainer's), and the
    sampler's own mesh, if any."""

    cfg: RolloutConfig
    policy: Any
    tokenizer: Any
    mesh: Any
    checkpoint: Path | None
    max_prompt_length: int
    rollout_dtype: str | None = None
    # The sampler's own devices when they are not the trainer's (`MeshConfig.rollout_devices`);
    # None: it samples on the training mesh's devices.
    sampling_mesh: Any = None


@runtime_checkable
class Sampler(Protocol):
    """A generation backend for RL (see the module docstring)."""

    # The version of the weights the sampler holds, as their push delivered it (None: none,
    # or pushed without a version); `release` and `close` leave None.
    policy_version: int | None

    def push_weights(self, params: Any, version: int | None = None) -> WeightPush:
        """Make the next `generate` sample with `params` (the policy's whole nnx State, as
        the trainer holds it, or what this backend's `stage_weights` returned); returns when
        they are in place. `version`: theirs, set as `policy_version` by what the push
        delivers (the module docstring)."""
        ...

    def generate(
        self,
        prompts: Sequence[np.ndarray],
        sampling: SamplingParams,
        *,
        tool: ToolCallback | None = None,
        prompt_indices: Sequence[int] | None = None,
        on_finish: OnFinish | None = None,
        progress: Progress | None = None,
        refresh: Refresh | None = None,
    ) -> list[Completion]:
        """`sampling.n` samples of every prompt (int32 token ids) with the last pushed
        weights, prompt-major. `prompt_indices`: each prompt's index for its samples' seeds
        (a host's share of a global batch passes the global rows). `on_finish(index,
        completion)` as each sample finishes; `progress(done, total)` for progress bars.
        `refresh` (partial rollouts; only a backend registered with `partial_rollouts`
        gets one): asked between device calls for newer weights, which the samples still
        decoding continue with, each token's version in `Completion.token_versions`."""
        ...

    def metrics(self) -> dict[str, float]:
        """The backend's own counters since the last call, as `rollout/<backend>/*` metrics."""
        ...

    def release(self) -> None:
        """Sampling is over until the next `push_weights`: drop any copy of the weights kept
        for it (the JAX engine's cast or gathered copy), so training has that memory."""
        ...

    def close(self) -> None:
        """Free the backend's memory, processes and threads; the sampler is unusable after."""
        ...


def build_sampler(ctx: SamplerContext) -> Sampler:
    """The sampler `ctx.cfg.backend` names, checked against the `Sampler` contract."""
    from jaxrl_llm.rollout.backends import BACKENDS, check_backend_name
    from jaxrl_llm.tools.factory import resolve_import_path

    name = ctx.cfg.backend
    check_backend_name(name)
    path = BACKENDS[name].factory if name in BACKENDS else name
    sampler = resolve_import_path(path, "rollout.backend")(ctx)
    if not isinstance(sampler, Sampler):
        close = getattr(sampler, "close", None)
        if callable(close):
            close()
        methods = ("push_weights", "generate", "metrics", "release", "close", "policy_version")
        missing = [m for m in methods if not hasattr(sampler, m)]
        raise PluginContractError(
            f"rollout.backend = {name!r} returned a {type(sampler).__name__} without the "
            f"Sampler contract (rollout/sampler.py); missing: {missing}"
        )
    return sampler
