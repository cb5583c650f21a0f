"""The default sampler backend: our paged JAX engine over the trainer's live arrays.

`push_weights` hands the trainer's params to the engine (`hosts.WeightSync`: the very same
arrays when the training and sampling layouts agree and nothing is cast, else one jitted
re-layout/cast; multi-host, a full copy on each host's devices; with LoRA the adapters only,
the frozen base once). The version pushed with them travels in the same transfer (an int32
beside the adapters, or beside the whole params without LoRA), and `policy_version` is read
from the sampler's side of it: an update that never arrived leaves the old version.
`generate` runs `RolloutDriver` (continuous batching, stop strings, tool turns appended to
the live KV row) with those params.
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
    Refresh,
    SamplerContext,
    StagedWeights,
    ToolCallback,
    WeightPush,
    check_version,
)
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Completion


class JaxSampler:
    """`Sampler` on `rollout.Engine` + `RolloutDriver`, sized by `RolloutConfig.max_slots`
    and `steps_per_call`; with several processes each host samples on its own devices
    (`hosts.local_sampling_mesh`)."""

    policy_version: int | None = None  # the weights' version, as their push delivered it

    def __init__(self, ctx: SamplerContext):
        from flax import nnx

        from jaxrl_llm.models.quant import int8_sampler_model
        from jaxrl_llm.rollout import Engine, RolloutDriver

        r = ctx.cfg
        # 'int8' / 'w8a8': the engine compiles for the policy with int8 projections; the
        # sync quantises the trainer's weights into that tree once per update.
        int8 = r.weights in ("int8", "w8a8")
        sampler_model = (
            int8_sampler_model(ctx.policy, activations=r.weights == "w8a8") if int8 else ctx.policy
        )
        self.engine = Engine(
            sampler_model,
            max_concurrent_decodes=r.max_slots,
            max_cache_length=ctx.max_prompt_length + r.max_new_tokens + 1,
            max_prefill_length=ctx.max_prompt_length,
            mesh=ctx.sampling_mesh or hosts.local_sampling_mesh(ctx.mesh),
            tokenizer=ctx.tokenizer,
            keep_params=False,  # the trainer's live params come with every call
            kv_dtype=None if r.kv_cache_dtype == "auto" else r.kv_cache_dtype,
        )
        self.driver = RolloutDriver(
            self.engine, ctx.tokenizer, steps_per_call=r.steps_per_call,
            max_tool_turns=r.max_tool_calls, tool_workers=r.tool_workers,
        )  # fmt: skip
        # Rollout weights may be narrower (e.g. bfloat16: half the bytes read per decoded
        # token); the trainer's master weights are untouched, and the gap shows in
        # rollout/logprob_diff/*. One jitted cast (and, multi-host, gather) per step.
        cast = _make_cast(ctx.rollout_dtype, int8=int8)
        self._sync = _AdapterSync(
            nnx.state(sampler_model), ctx.mesh, self.engine.param_shardings, cast
        )
        self.params: Any = None

    def stage_weights(self, params: Any, version: int | None = None) -> StagedWeights:
        """The part of `push_weights` that runs device collectives across hosts (the cast
        and gather of `hosts.WeightSync.stage`), done now on the calling thread, into new
        buffers; pushing the result runs none, so another thread may push it while this one
        goes on with the trainer's collectives (a multi-host overlapped run)."""
        return self._sync.stage(params, version)

    def push_weights(self, params: Any, version: int | None = None) -> WeightPush:
        t0 = time.perf_counter()
        staged = params if isinstance(params, StagedWeights) else None
        if staged is not None and staged.version != version:  # refused: nothing changes
            raise ValueError(f"weights staged as version {staged.version} pushed as {version}")
        self.policy_version = None  # until the push below has delivered
        if staged is None:
            staged = self._sync.stage(params, version)
        # The wait is the contract's ("returns when they are in place") and the timer's:
        # without it `seconds` would time the dispatch of the re-layout/cast only. It moved
        # here from `rl_loop._collect` (the same barrier, there since before the seam); no
        # race depends on it, the engine's programs take the arrays as inputs either way.
        self.params, delivered = jax.block_until_ready(self._sync.finish(staged))
        self.policy_version = _version_of(delivered)
        return WeightPush(staged.bytes, time.perf_counter() - t0)

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
        if self.params is None:
            raise RuntimeError("push_weights(params) before generate: the sampler has none")
        swap = None if refresh is None else lambda: self._swap(refresh)
        return self.driver.generate(
            prompts, sampling, params=self.params, tool=tool, progress=progress,
            prompt_indices=prompt_indices, on_finish=on_finish, refresh=swap,
            version=self.policy_version or 0,
        )  # fmt: skip

    def _swap(self, refresh: Refresh) -> tuple[Any, int] | None:
        """Partial rollouts: push the newer weights `refresh` hands over, if any, between two
        device calls (the driver continues running samples with them)."""
        newer = refresh()
        if newer is None:
            return None
        self.push_weights(newer.params, newer.version)
        check_version(self.policy_version, newer.version)
        return self.params, newer.version

    def metrics(self) -> dict[str, float]:
        """None: the driver's counters (`driver.stats`) are per host, and a run's metrics
        are the same whatever its hosts (tests/integration/test_multihost.py)."""
        return {}

    def release(self) -> None:
        self.params = None  # with a cast or a multi-host gather, a copy of the weights
        self.policy_version = None

    def close(self) -> None:
        self.params = None
        self.policy_version = None


def build(ctx: SamplerContext) -> JaxSampler:
    return JaxSampler(ctx)


_VERSION = "policy_version"  # the version's key beside the params' (never a model's)
_NO_VERSION = -1  # a push without a version: one program whether or not one is given


class _AdapterSync:
    """`hosts.WeightSync` for a policy State and its version; with LoRA adapters
    (`models.lora`), one sync for the adapters on every call and one for the frozen base,
    run again only when the base's arrays change (never, in an RL run): a step moves adapter
    bytes only. The version is an int32 Variable merged into the tree synced on every call
    (the adapters, or the whole State), so it arrives by the same transfer or not at all.
    A sync is `stage` (every cross-host collective) then `finish` (none), which returns
    (the params for the engine, the version as delivered)."""

    def __init__(self, state, mesh, shardings, cast):
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        from jaxrl_llm.models.lora import has_adapters, split_adapters

        self._lora = has_adapters(state)
        # The version starts replicated where the params are (the training mesh; without
        # one, the sampler's), so a sync that is a pointer stays one.
        sampling = jax.tree.leaves(shardings)[0].mesh
        self._source = NamedSharding(mesh or sampling, PartitionSpec())
        tag = _tagged(self._version(None))
        # The sharding trees hold plain leaves, the params' trees Variables.
        tag_out = nnx.State({_VERSION: NamedSharding(sampling, PartitionSpec())})
        if not self._lora:
            self._all = hosts.WeightSync(
                _merge(state, tag), mesh, _merge(shardings, tag_out), cast=cast
            )
            return
        self._split = split_adapters
        (adapters, base), (ad_out, base_out) = split_adapters(state), split_adapters(shardings)
        self._adapters = hosts.WeightSync(
            _merge(adapters, tag), mesh, _merge(ad_out, tag_out), cast=cast
        )
        self._base = hosts.WeightSync(base, mesh, base_out, cast=cast)
        self._base_src: list | None = None
        self._base_synced = None

    def _version(self, version: int | None):
        value = _NO_VERSION if version is None else version
        # Every process holds the same value (multi-host: one global array).
        return hosts.global_array(np.asarray(value, np.int32), self._source)

    def stage(self, params, version: int | None) -> StagedWeights:
        """The sync's cross-host part (`hosts.WeightSync.stage`): on the trainer's thread
        when another thread samples (`JaxSampler.stage_weights`)."""
        from jaxrl_llm.models.lora import state_bytes

        tag = _tagged(self._version(version))
        if not self._lora:
            staged = self._all.stage(_merge(params, tag))
            return StagedWeights((staged,), version, state_bytes(params))
        adapters, base = self._split(params)
        leaves = jax.tree.leaves(base)
        moved = state_bytes(adapters)
        if self._base_src is None or any(
            a is not b for a, b in zip(leaves, self._base_src, strict=True)
        ):
            self._base_synced, self._base_src = self._base(base), leaves
            moved += state_bytes(base)
        assert self._base_synced is not None  # synced above on the first call
        staged = self._adapters.stage(_merge(adapters, tag))
        return StagedWeights((staged, self._base_synced), version, moved)

    def finish(self, staged: StagedWeights) -> tuple[Any, jax.Array]:
        """(the params for the engine, the version as delivered) of a staged sync; runs no
        cross-host program."""
        if not self._lora:
            return _split_version(self._all.local(staged.arrays[0]))
        adapters, base = staged.arrays
        synced, delivered = _split_version(self._adapters.local(adapters))
        return _merge(synced, base), delivered


def _merge(*states):
    from flax import nnx

    return nnx.merge_state(*states)


def _tagged(value):
    """The version as a State of its own, merged beside the params it travels with."""
    from flax import nnx

    return nnx.State({_VERSION: nnx.Variable(value, logical_axes=())})


def _split_version(synced):
    """(the params, the version's array) of a synced tree."""
    from flax import nnx

    version, params = nnx.split_state(synced, lambda path, _: path == (_VERSION,), ...)
    (value,) = jax.tree.leaves(version)
    return params, value


def _version_of(delivered: jax.Array) -> int | None:
    value = int(np.asarray(delivered))
    return None if value == _NO_VERSION else value


def _make_cast(dtype: str | None, *, int8: bool = False):
    """The map from the trainer's params to the sampler's, or None (the same arrays):
    projections quantised to int8 from the master weights (`int8`) with scales already in
    `dtype` (so the stored pair keeps the s / 2 bound), then floats cast to `dtype`."""
    import jax.numpy as jnp

    from jaxrl_llm.models.config import as_dtype
    from jaxrl_llm.models.quant import quantize_projections

    if dtype is None and not int8:
        return None
    target = None if dtype is None else as_dtype(dtype)

    def narrow(x):
        return x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def cast(params):
        params = quantize_projections(params, target) if int8 else params
        return params if target is None else jax.tree.map(narrow, params)

    return cast
