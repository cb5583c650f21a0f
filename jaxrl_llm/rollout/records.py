"""The engine's device records: a prefilled prompt batch, the decode state, step records.

Each is generic in its leaf type (`Leaf`, as `SlotSampling`): `jax.Array` by default,
`NamedSharding` in the engine's sharding pytrees, numpy arrays once read on the host.

Shapes: B slots, M prompts, P padded prompt, D embed, L layers, K kv heads, H head dim, NP
pages in the pool, ps page size, pps pages per sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic

import jax

from jaxrl_llm.models import KVCache
from jaxrl_llm.models.kv_int8 import Int8Pages
from jaxrl_llm.rollout.sampling import Leaf, SlotSampling


class ParamsRef:
    """A mutable reference to params: `ref.value = new_params` after each train step."""

    def __init__(self, value: Any):
        self.value = value


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Prefix(Generic[Leaf]):
    """M prefilled prompts (1 from JetStream's `prefill`, several from `prefill_many`):
    cache [L, M, P, K, H], last hidden states [M, D], true lengths [M]."""

    cache: KVCache[Leaf]
    hidden: Leaf
    length: Leaf


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeState(Generic[Leaf]):
    kv_pages: tuple[Leaf | Int8Pages[Leaf], ...]  # per layer [NP, ps, 2K, H] (int8: + scales)
    page_table: Leaf  # [B, pps] int32 (NP past a slot's reservation)
    hidden: Leaf  # [B, D] hidden state of each row's last cached token
    lengths: Leaf  # [B] int32 tokens in the cache row (= next position)
    generated: Leaf  # [B] int32 tokens sampled since insert / resume
    max_new: Leaf  # [B] int32 token budget of the current turn
    active: Leaf  # [B] bool
    sampling: SlotSampling[Leaf]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepRecords(Generic[Leaf]):
    """What k decode steps produced, each [k, B]; `valid` marks slots that sampled."""

    tokens: Leaf  # int32
    logprobs: Leaf  # float32
    raw_logprobs: Leaf  # float32
    valid: Leaf  # bool
    done: Leaf  # bool
