"""Token sampling with per-slot parameters, and the logprobs RL needs.

Every slot of a decode batch carries its own temperature, top-k, top-p and seed as array
entries, so a batch that mixes greedy, tempered and nucleus requests runs one compiled
program. Order of operations follows Hugging Face `generate` (and vLLM): logits / T, then
top-k, then top-p on the renormalised top-k distribution, then a categorical draw. One
difference: top-k keeps exactly k tokens, ties at the k-th resolved by rank, where both
keep every token tied with it (exact ties are rare in float32 logits; docs/vllm.md).

Two logprobs per sampled token:
- `logprobs`: log-probability under the distribution actually sampled from (tempered and
  filtered). A greedy slot samples from a point mass, so its value is 0.
- `raw_logprobs`: `log_softmax(logits)[token]` of the untempered, unfiltered logits, for
  requests that ask (`SamplingParams.raw_logprobs`; 0 for the others): a second softmax
  over the vocabulary per token, skipped when no slot of the batch asked.

Randomness: the key of slot b at a step is `fold_in(key(seed[b]), position[b])`, a
function of the request's seed and the token's position only, so a sample does not depend
on which slot it ran in, on the batch around it, or on how steps were grouped into calls.

Shapes: B slots, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Generic

import jax
import jax.numpy as jnp
import numpy as np
from typing_extensions import TypeVar  # `default=` (PEP 696) before Python 3.13

from jaxrl_llm.config_checks import FLOAT32_MAX

Array = jax.Array
# The leaves of a `SlotSampling`: `jax.Array` (the default), numpy scalars on the host
# (`SlotSampling.one`), `NamedSharding` in a sharding pytree. (As `jaxrl_llm.types.Leaf`,
# which this module cannot import: `types` refers to the driver, which imports this.)
Leaf = TypeVar("Leaf", default=jax.Array)

GREEDY_TEMPERATURE = 0.0
# The largest top_k a slot holds (int32): any k >= V keeps every token, so a larger k is the
# same filter.
MAX_TOP_K = int(np.iinfo(np.int32).max)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (a prompt and its `n` samples).

    temperature 0 means greedy; top_k 0 and top_p 1 disable those filters. `stop` strings
    end a sample when they appear in its decoded text (kept in the output). `seed` with
    the prompt and sample index determines every random draw. `raw_logprobs`: also record
    each token's log-probability under the untempered, unfiltered logits.
    `max_new_tokens` bounds the whole response (tool output included); `max_turn_tokens`,
    when set, bounds each model turn (the tokens between two tool outputs): a turn that
    reaches it ends the sample, cut there, with reason "length", as the whole budget does.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int = 0
    raw_logprobs: bool = False
    max_turn_tokens: int | None = None

    def __post_init__(self):
        # NaN fails every comparison; the slot holds float32, where 1e39 is already inf.
        if not 0 <= self.temperature <= FLOAT32_MAX:
            raise ValueError(
                f"temperature must be finite (in float32) and >= 0, got {self.temperature}"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1 or None, got {self.max_turn_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A uint32 seed for one sample, a pure function of (seed, prompt, sample)."""
    seq = np.random.SeedSequence([seed & 0xFFFFFFFF, prompt_index, sample_index])
    return int(seq.generate_state(1, dtype=np.uint32)[0])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotSampling(Generic[Leaf]):
    """Per-slot sampling parameters as arrays [B] (scalars [] for one slot: numpy scalars
    on the host, `one`)."""

    temperature: Leaf  # float32
    top_k: Leaf  # int32, 0 = off
    top_p: Leaf  # float32, 1 = off
    seed: Leaf  # uint32
    raw: Leaf  # bool: record raw logprobs

    @staticmethod
    def fill(batch: int, params: SamplingParams | None = None) -> SlotSampling:
        p = params or SamplingParams(temperature=GREEDY_TEMPERATURE)
        return SlotSampling(
            jnp.full((batch,), p.temperature, jnp.float32),
            jnp.full((batch,), min(p.top_k, MAX_TOP_K), jnp.int32),
            jnp.full((batch,), p.top_p, jnp.float32),
            jnp.full((batch,), p.seed, jnp.uint32),
            jnp.full((batch,), p.raw_logprobs, jnp.bool_),
        )

    @staticmethod
    def one(params: SamplingParams, seed: int) -> SlotSampling[np.generic]:
        return SlotSampling(
            np.float32(params.temperature),
            np.int32(min(params.top_k, MAX_TOP_K)),
            np.float32(params.top_p),
            np.uint32(seed),
            np.bool_(params.raw_logprobs),
        )


def step_keys(seed: Array, positions: Array) -> Array:
    """Per-slot PRNG keys [B] for the tokens at `positions` [B]."""
    return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seed, positions)


def filter_mask(scaled: Array, top_k: Array, top_p: Array) -> Array:
    """Boolean [B, V]: tokens kept by top-k then top-p (at least the top token is kept).

    Works in sorted order and scatters back, so ties at the threshold are resolved by
    rank (exactly k tokens survive top-k) rather than by value. A row with top_k = 0 and
    top_p = 1 keeps every token, so a slot's distribution does not depend on whether
    another slot of the batch asked for a filter.
    """
    B, V = scaled.shape
    order = jnp.argsort(-scaled, axis=-1)  # stable: equal logits keep vocab order
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(V)[None, :]
    k = jnp.where(top_k > 0, top_k, V)[:, None]
    keep = rank < k
    probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # top_p >= 1 filters nothing: the float32 cumulative sum can reach 1 before the tail.
    keep &= (mass_before < top_p[:, None]) | (rank == 0) | (top_p[:, None] >= 1.0)
    rows = jnp.arange(B)[:, None]
    return jnp.zeros((B, V), jnp.bool_).at[rows, order].set(keep)


def sample_tokens(
    logits: Array, sampling: SlotSampling, positions: Array
) -> tuple[Array, Array, Array]:
    """Sample one token per slot. logits [B, V] float32 -> tokens, logprobs, raw_logprobs [B].

    The sort behind top-k/top-p runs only when some slot asks for a filter, the raw
    log-softmax only when some slot asks for raw logprobs (0 in the slots that did not).
    """
    logits = logits.astype(jnp.float32)
    greedy = sampling.temperature <= 0.0
    temp = jnp.where(greedy, 1.0, sampling.temperature)
    scaled = logits / temp[:, None]
    wants_filter = (sampling.top_k > 0) | (sampling.top_p < 1.0)

    def filtered(x):
        return jnp.where(filter_mask(x, sampling.top_k, sampling.top_p), x, -jnp.inf)

    scaled = jax.lax.cond(jnp.any(wants_filter & ~greedy), filtered, lambda x: x, scaled)
    top = jnp.argmax(logits, axis=-1)

    def draw(scaled: Array) -> Array:  # a draw per slot; the greedy slots' argmax kept
        drawn = jax.vmap(jax.random.categorical)(step_keys(sampling.seed, positions), scaled)
        return jnp.where(greedy, top, drawn)

    # All greedy (evaluation, a greedy benchmark): no noise drawn. Over a 151,936-token
    # vocabulary the noise took 3.4-4.4 ms a step on a 2-core CPU (profiled), about a tenth
    # of an int8 Qwen2.5-0.5B decode step there (docs/performance.md).
    tokens = jax.lax.cond(jnp.all(greedy), lambda x: top, draw, scaled).astype(jnp.int32)
    processed = jax.nn.log_softmax(scaled, axis=-1)
    pick = tokens[:, None]
    logprobs = jnp.where(greedy, 0.0, jnp.take_along_axis(processed, pick, axis=-1)[:, 0])
    raw_logprobs = jax.lax.cond(
        jnp.any(sampling.raw),
        lambda: jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), pick, axis=-1)[:, 0],
        lambda: jnp.zeros(tokens.shape, jnp.float32),
    )
    return tokens, logprobs, jnp.where(sampling.raw, raw_logprobs, 0.0)
