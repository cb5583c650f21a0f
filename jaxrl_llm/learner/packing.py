"""Sequence packing: several samples per row for the model's forwards, one sample per row
for everything else.

The `TrainBatch` keeps one sample per row, [B, T] with T = `RLConfig.seq_len`: advantages,
losses and their aggregation modes read it unchanged, so packing cannot alter their
semantics. Only the transformer runs on packed rows: per micro-batch of mb samples, the
samples are placed whole into R <= mb rows of T tokens (first-fit decreasing, host-side,
from their lengths), a row's samples told apart by segment ids (block-diagonal causal
attention) with positions restarting at 0 in each. The forward gathers the micro-batch's
tokens into those rows (`pack`), and its per-token outputs (logprobs, entropy, values)
are gathered back (`unpack`); both gathers are differentiable, so the backward pass runs
on the packed rows too.

R varies with the lengths; it is rounded up to a multiple of `row_bucket` (mb / 4), so a
run compiles a few programs, not one per step. Packing pays only when it removes rows: the
gathers, the segment mask and a new program cost about 10-20% of a step on the default
run's shape (measured, docs/performance.md), so a micro-batch that packs into more than
`MAX_PACKED_ROWS` of its rows is run unpacked (`worth_packing`).

Shapes: M micro-batches, mb samples each, R packed rows, T tokens per row.
"""

from __future__ import annotations

import dataclasses
from typing import Generic

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.data.packing import Lengths, first_fit_rows
from jaxrl_llm.types import Leaf

MAX_PACKED_ROWS = 0.75  # of the micro-batch's rows: packing beyond this costs more than it saves


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Packing(Generic[Leaf]):
    """Where each token of a micro-batch sits in its packed rows (int32 arrays).

    src [R, T]: flat index j * T + t into the micro-batch's [mb, T] arrays of the token at
    each packed position (0 on padding); segment_ids [R, T]: 1 + j, the sample's index in
    the micro-batch (0 = padding); positions [R, T]: t, the token's position in its sample;
    dst [mb, T]: flat index r * T + p of each sample token in the packed rows (-1 past the
    sample's end). A leading M axis when stacked per micro-batch.
    """

    src: Leaf
    segment_ids: Leaf
    positions: Leaf
    dst: Leaf


def row_bucket(micro_batch: int, multiple: int) -> int:
    """The step R is rounded up to: a multiple of `multiple` (the devices the rows are split
    over) and of mb / 4, so at most 4 row counts (compiled shapes) per micro-batch size."""
    return max(multiple, -(-micro_batch // 4 // multiple) * multiple)


def worth_packing(packing: Packing[np.ndarray], micro_batch: int) -> bool:
    """Whether the packed rows are few enough to beat one padded sample per row."""
    return packing.src.shape[-2] <= MAX_PACKED_ROWS * micro_batch


def packing_layout(
    lengths: Lengths, micro_batch: int, seq_len: int, *, multiple: int = 1
) -> Packing[np.ndarray]:
    """The `Packing` [M, ...] of micro-batches of `micro_batch` consecutive samples whose
    token counts (prompt + response) are `lengths` [M * mb]; R is the same for every
    micro-batch (the most any needs, rounded up by `row_bucket`, at most mb rounded up to
    `multiple`)."""
    n = len(lengths)
    if n % micro_batch:
        raise ValueError(f"{n} samples are not a whole number of micro-batches of {micro_batch}")
    chunks = [lengths[i : i + micro_batch] for i in range(0, n, micro_batch)]
    rows = [first_fit_rows(c, seq_len) for c in chunks]
    step = row_bucket(micro_batch, multiple)
    R = min(-(-max(len(r) for r in rows) // step) * step, -(-micro_batch // multiple) * multiple)
    parts = [_layout(r, c, R, seq_len) for r, c in zip(rows, chunks, strict=True)]
    return jax.tree.map(lambda *xs: np.stack(xs), *parts)


def _layout(rows: list[list[int]], lengths: Lengths, R: int, T: int) -> Packing[np.ndarray]:
    src = np.zeros((R, T), np.int32)
    seg = np.zeros((R, T), np.int32)
    pos = np.zeros((R, T), np.int32)
    dst = np.full((len(lengths), T), -1, np.int32)
    for r, samples in enumerate(rows):
        p = 0
        for j in samples:
            n = int(lengths[j])
            src[r, p : p + n] = j * T + np.arange(n)
            seg[r, p : p + n] = j + 1
            pos[r, p : p + n] = np.arange(n)
            dst[j, :n] = r * T + p + np.arange(n)
            p += n
    return Packing(src, seg, pos, dst)


def pack(x: jax.Array, packing: Packing) -> jax.Array:
    """Per-sample [mb, T] -> packed [R, T] (padding positions hold an arbitrary token)."""
    return x.reshape(-1)[packing.src]


def unpack(y: jax.Array, packing: Packing) -> jax.Array:
    """Packed [R, T] -> per-sample [mb, T], 0 past each sample's end."""
    flat = y.reshape(-1)[jnp.maximum(packing.dst, 0)]
    return jnp.where(packing.dst >= 0, flat, jnp.zeros((), y.dtype))


def forward_positions(samples: int, packing: Packing[np.ndarray] | None, T: int) -> int:
    """Token positions the forwards run on: the packed rows, else one row of T per sample."""
    return samples * T if packing is None else packing.src.size


def padding_fraction(lengths: Lengths, packing: Packing[np.ndarray] | None, T: int) -> float:
    """Share of the forwards' token positions that are padding."""
    return 1.0 - float(np.sum(lengths)) / forward_positions(len(lengths), packing, T)
