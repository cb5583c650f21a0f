"""The engine's device programs: prefill, init, insert, append, deactivate, k decode steps.

Each is a pure function of arrays that `Engine` jits with its shardings (donating the
decode state it transforms). They know nothing of shardings or of the host's page
bookkeeping: the host passes where each token goes (a slot's page-table row, the flat
destinations of a prompt's tokens).

A step samples from the stored hidden state's logits, then appends the sampled token to
the cache: so prefill computes no logits at all, and the first token of each of n samples
inserted from one prefix is drawn in its own slot with its own seed.

Shapes: B slots, M prompts, S cache length, P padded prompt, D embed, L layers, K kv heads,
H head dim, NP pages in the pool, ps page size, pps = ceil(S / ps).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import CausalLM, KVCache
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.kv_int8 import new_pool
from jaxrl_llm.models.paged import write_kv
from jaxrl_llm.rollout.records import DecodeState, Prefix, StepRecords
from jaxrl_llm.rollout.sampling import SlotSampling, sample_tokens

Array = jax.Array


class DecodePrograms:
    """The traced functions over the model `graphdef` of `config`: B = `batch` slots, S =
    `cache_length`, a pool of `num_pages` pages of `page_size` tokens (`pages_per_seq` per
    sequence) in `kv_dtype`; a token in `eos_ids` ends its sample. `trace_counts` counts
    traces (= compiles) per function."""

    def __init__(
        self,
        graphdef: nnx.GraphDef[CausalLM],
        config: ModelConfig,
        *,
        batch: int,
        cache_length: int,
        page_size: int,
        pages_per_seq: int,
        num_pages: int,
        kv_dtype: np.dtype,
        eos_ids: np.ndarray,
    ):
        self.graphdef = graphdef
        self.config = config
        self.batch = batch
        self.cache_length = cache_length
        self.page_size = page_size
        self.pages_per_seq = pages_per_seq
        self.num_pages = num_pages
        self.kv_dtype = kv_dtype
        self.eos_ids = eos_ids
        self.trace_counts: collections.Counter[str] = collections.Counter()

    def _count(self, name: str) -> None:
        self.trace_counts[name] += 1  # runs at trace time only

    def _model(self, params: Any) -> CausalLM:
        return nnx.merge(self.graphdef, params)

    def prefill(self, params: Any, tokens: Array, lengths: Array) -> Prefix:
        """Prompts [M, P] (row m's first lengths[m] tokens real): their keys/values and
        last hidden states; no logits (the first token is sampled at the first step)."""
        M, P = tokens.shape
        self._count(f"prefill[{M}x{P}]")
        model = self._model(params)
        cache = KVCache.zeros(self.config, M, P)
        lengths = lengths.astype(jnp.int32)
        h, cache = model.extend(cache, tokens.astype(jnp.int32), jnp.zeros(M, jnp.int32), lengths)
        return Prefix(cache, h[jnp.arange(M), lengths - 1], lengths)

    def init(self) -> DecodeState:
        self._count("init")
        cfg, B = self.config, self.batch
        dtype = jnp.dtype(cfg.dtype)
        zeros = jnp.zeros(B, jnp.int32)
        pool = (self.num_pages, self.page_size, 2 * cfg.num_kv_heads, cfg.head_dim)
        return DecodeState(
            kv_pages=tuple(new_pool(pool, self.kv_dtype) for _ in range(cfg.num_layers)),
            page_table=jnp.full((B, self.pages_per_seq), self.num_pages, jnp.int32),
            hidden=jnp.zeros((B, cfg.hidden_size), dtype),
            lengths=zeros,
            generated=zeros,
            max_new=zeros,
            active=jnp.zeros(B, jnp.bool_),
            sampling=SlotSampling.fill(B),
        )

    def insert(self, prefix: Prefix, state: DecodeState, slot: Array, m: Array, row: Array,
               dest: Array, sampling: SlotSampling, max_new: Array) -> DecodeState:  # fmt: skip
        """Write prompt m of the prefix at flat slots `dest` [P] (shared pages only once)
        and point the slot's page-table row at its pages."""
        self._count(f"insert[{prefix.cache.k.shape[1]}x{prefix.cache.k.shape[2]}]")
        take = functools.partial(jax.lax.dynamic_index_in_dim, index=m, axis=1, keepdims=False)
        k, v = take(prefix.cache.k), take(prefix.cache.v)  # [L, P, K, H]
        kv_pages = tuple(write_kv(pool, k[i], v[i], dest) for i, pool in enumerate(state.kv_pages))
        sampling = jax.tree.map(lambda a, x: a.at[slot].set(x), state.sampling, sampling)
        return DecodeState(
            kv_pages=kv_pages,
            page_table=state.page_table.at[slot].set(row),
            hidden=state.hidden.at[slot].set(prefix.hidden[m].astype(state.hidden.dtype)),
            lengths=state.lengths.at[slot].set(prefix.length[m]),
            generated=state.generated.at[slot].set(0),
            max_new=state.max_new.at[slot].set(max_new),
            active=state.active.at[slot].set(True),
            sampling=sampling,
        )

    def append(self, params: Any, state: DecodeState, slot: Array, tokens: Array,
               num_tokens: Array, start: Array, sampling: SlotSampling,
               max_new: Array) -> DecodeState:  # fmt: skip
        """Extend slot's row with the first `num_tokens` of `tokens` after its first `start`
        cached tokens, and resume sampling there with `sampling` and budget `max_new`."""
        self._count(f"append[{tokens.shape[-1]}]")
        model = self._model(params)
        h, kv_pages = model.extend_paged(
            state.kv_pages, state.page_table[slot][None], tokens[None].astype(jnp.int32),
            start[None], num_tokens[None],
        )  # fmt: skip
        sampling = jax.tree.map(lambda a, x: a.at[slot].set(x), state.sampling, sampling)
        return DecodeState(
            kv_pages=kv_pages,
            page_table=state.page_table,
            hidden=state.hidden.at[slot].set(h[0, num_tokens - 1].astype(state.hidden.dtype)),
            lengths=state.lengths.at[slot].set(start + num_tokens),
            generated=state.generated.at[slot].set(0),
            max_new=state.max_new.at[slot].set(max_new),
            active=state.active.at[slot].set(True),
            sampling=sampling,
        )

    def deactivate(self, state: DecodeState, slots_mask: Array) -> DecodeState:
        self._count("deactivate")
        return dataclasses.replace(state, active=state.active & ~slots_mask)

    def _one_step(self, model: CausalLM, state: DecodeState) -> tuple[DecodeState, StepRecords]:
        S = self.cache_length
        logits = model.logits(state.hidden)  # [B, V], only where needed
        tokens, logprobs, raw = sample_tokens(logits, state.sampling, state.lengths)
        valid = state.active
        write = valid & (state.lengths < S)
        h, kv_pages = model.extend_paged(
            state.kv_pages, state.page_table, tokens[:, None], state.lengths,
            write.astype(jnp.int32),
        )  # fmt: skip
        lengths = state.lengths + write
        generated = state.generated + valid
        eos = jnp.isin(tokens, jnp.asarray(self.eos_ids))
        done = valid & (eos | (generated >= state.max_new) | (lengths >= S))
        new = dataclasses.replace(
            state,
            kv_pages=kv_pages,
            hidden=jnp.where(write[:, None], h[:, 0], state.hidden),
            lengths=lengths,
            generated=generated,
            active=valid & ~done,
        )
        return new, StepRecords(tokens, logprobs, raw, valid, done)

    def steps(
        self, num_steps: int, params: Any, state: DecodeState
    ) -> tuple[DecodeState, StepRecords]:
        """`num_steps` decode steps (a scan; a step with no active slot is skipped) ->
        the new state and records [num_steps, B]."""
        self._count(f"generate_steps[{num_steps}]")
        model = self._model(params)

        def idle(s: DecodeState) -> tuple[DecodeState, StepRecords]:
            z = jnp.zeros(self.batch, jnp.int32)
            f = jnp.zeros(self.batch, jnp.float32)
            off = jnp.zeros(self.batch, jnp.bool_)
            return s, StepRecords(z, f, f, off, off)

        def body(s: DecodeState, _: None) -> tuple[DecodeState, StepRecords]:
            return jax.lax.cond(jnp.any(s.active), lambda x: self._one_step(model, x), idle, s)

        return jax.lax.scan(body, state, None, length=num_steps)
