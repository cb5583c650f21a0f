"""The default sampler backend: our paged JAX engine over the trainer's live arrays.

`push_weights` hands the trainer's params to the engine (`hosts.WeightSync`: the very same
arrays when the training and sampling layouts agree and nothing is cast, else one jitted
re-layout/cast; multi-host, a full copy on each host's devices; with LoRA the adapters only,
the frozen base once). `generate` runs `RolloutDriver` (continuous batching, stop strings,
tool turns appended to the live KV row) with those params.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_llm.rollout.sampler import (
    OnFinish,
    Progress,
    SamplerContext,
    ToolCallback,
    WeightPush,
)
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Completion


class JaxSampler:
    """`Sampler` on `rollout.Engine` + `RolloutDriver`, sized by `RolloutConfig.max_slots`
    and `steps_per_call`; with several processes each host samples on its own devices
    (`hosts.local_sampling_mesh`)."""

    def __init__(self, ctx: SamplerContext):
        from flax import nnx

        from jaxrl_llm.rollout import Engine, RolloutDriver

        r = ctx.cfg
        self.engine = Engine(
            ctx.policy,
            max_concurrent_decodes=r.max_slots,
            max_cache_length=ctx.max_prompt_length + r.max_new_tokens + 1,
            max_prefill_length=ctx.max_prompt_length,
            mesh=ctx.sampling_mesh or hosts.local_sampling_mesh(ctx.mesh),
            tokenizer=ctx.tokenizer,
            keep_params=False,  # the trainer's live params come with every call
        )
        self.driver = RolloutDriver(
            self.engine, ctx.tokenizer, steps_per_call=r.steps_per_call,
            max_tool_turns=r.max_tool_calls,
        )  # fmt: skip
        # Rollout weights may be narrower (e.g. bfloat16: half the bytes read per decoded
        # token); the trainer's master weights are untouched, and the gap shows in
        # rollout/logprob_diff/*. One jitted cast (and, multi-host, gather) per step.
        cast = _make_cast(ctx.rollout_dtype) if ctx.rollout_dtype else None
        self._sync = _AdapterSync(
            nnx.state(ctx.policy), ctx.mesh, self.engine.param_shardings, cast
        )
        self.params: Any = None

    def push_weights(self, params: Any) -> WeightPush:
        t0 = time.perf_counter()
        # The wait is the contract's ("returns when they are in place") and the timer's:
        # without it `seconds` would time the dispatch of the re-layout/cast only. It moved
        # here from `rl_loop._collect` (the same barrier, there since before the seam); no
        # race depends on it, the engine's programs take the arrays as inputs either way.
        self.params = jax.block_until_ready(self._sync(params))
        return WeightPush(self._sync.last_bytes, time.perf_counter() - t0)

    def generate(
        self,
        prompts: Sequence[np.ndarray],
        sampling: SamplingParams,
        *,
        tool: ToolCallback | None = None,
        prompt_indices: Sequence[int] | None = None,
        on_finish: OnFinish | None = None,
        progress: Progress | None = None,
    ) -> list[Completion]:
        if self.params is None:
            raise RuntimeError("push_weights(params) before generate: the sampler has none")
        return self.driver.generate(
            prompts, sampling, params=self.params, tool=tool, progress=progress,
            prompt_indices=prompt_indices, on_finish=on_finish,
        )  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """None: the driver's counters (`driver.stats`) are per host, and a run's metrics
        are the same whatever its hosts (tests/integration/test_multihost.py)."""
        return {}

    def release(self) -> None:
        self.params = None  # with a cast or a multi-host gather, a copy of the weights

    def close(self) -> None:
        self.params = None


def build(ctx: SamplerContext) -> JaxSampler:
    return JaxSampler(ctx)


class _AdapterSync:
    """`hosts.WeightSync` for a policy State; with LoRA adapters (`models.lora`), one sync
    for the adapters on every call and one for the frozen base, run again only when the
    base's arrays change (never, in an RL run): a step moves adapter bytes only."""

    def __init__(self, state, mesh, shardings, cast):
        from jaxrl_llm.models.lora import has_adapters, split_adapters

        self.last_bytes = 0
        self._lora = has_adapters(state)
        if not self._lora:
            self._all = hosts.WeightSync(state, mesh, shardings, cast=cast)
            return
        self._split = split_adapters
        (adapters, base), (ad_out, base_out) = split_adapters(state), split_adapters(shardings)
        self._adapters = hosts.WeightSync(adapters, mesh, ad_out, cast=cast)
        self._base = hosts.WeightSync(base, mesh, base_out, cast=cast)
        self._base_src: list | None = None
        self._base_synced = None

    def __call__(self, params):
        from flax import nnx

        from jaxrl_llm.models.lora import state_bytes

        if not self._lora:
            self.last_bytes = state_bytes(params)
            return self._all(params)
        adapters, base = self._split(params)
        leaves = jax.tree.leaves(base)
        self.last_bytes = state_bytes(adapters)
        if self._base_src is None or any(
            a is not b for a, b in zip(leaves, self._base_src, strict=True)
        ):
            self._base_synced, self._base_src = self._base(base), leaves
            self.last_bytes += state_bytes(base)
        assert self._base_synced is not None  # synced above on the first call
        return nnx.merge_state(self._adapters(adapters), self._base_synced)


def _make_cast(dtype: str):
    import jax.numpy as jnp

    from jaxrl_llm.models.config import as_dtype

    target = as_dtype(dtype)

    @jax.jit
    def cast(params):
        return jax.tree.map(
            lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
        )

    return cast
