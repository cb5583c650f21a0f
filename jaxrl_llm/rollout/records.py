"""The engine's device records: a prefilled prompt batch, the decode state, step records.

Shapes: B slots, M prompts, P padded prompt, D embed, L layers, K kv heads, H head dim, NP
pages in the pool, ps page size, pps pages per sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_llm.models import KVCache
from jaxrl_llm.rollout.sampling import SlotSampling

Array = jax.Array


class ParamsRef:
    """A mutable reference to params: `ref.value = new_params` after each train step."""

    def __init__(self, value: Any):
        self.value = value


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Prefix:
    """M prefilled prompts (1 from JetStream's `prefill`, several from `prefill_many`):
    cache [L, M, P, K, H], last hidden states [M, D], true lengths [M]."""

    cache: KVCache
    hidden: Array
    length: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeState:
    kv_pages: tuple[Array, ...]  # per layer [NP, ps, 2K, H]
    page_table: Array  # [B, pps] int32 (NP past a slot's reservation)
    hidden: Array  # [B, D] hidden state of each row's last cached token
    lengths: Array  # [B] int32 tokens in the cache row (= next position)
    generated: Array  # [B] int32 tokens sampled since insert / resume
    max_new: Array  # [B] int32 token budget of the current turn
    active: Array  # [B] bool
    sampling: SlotSampling


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepRecords:
    """What k decode steps produced, each [k, B]; `valid` marks slots that sampled."""

    tokens: Array
    logprobs: Array
    raw_logprobs: Array
    valid: Array
    done: Array
