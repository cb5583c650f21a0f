"""Keys and values a row must not attend to never reach its output (`models.paged`), even
when they are not finite.

Every walk reads such slots: a page table's unused entries hold the pool size (the engine's
"no page"), which a gather clamps to the last page, another live sequence's; and the slots
past a row's length in its last page keep what the page's previous occupant wrote (pages are
not cleared on reuse). A masked probability is 0, but 0 * inf is NaN in the p . v product.
The check needs no tolerance: an output the poisoned slots must not affect is, bit for bit,
the output with those slots finite.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import paged
from jaxrl_llm.models.kv_int8 import Int8Pages, quantize_kv, take_pages

P, PS, K, N, H = 15, 4, 2, 4, 8
NO_PAGE = P  # the engine's unused page-table entry: one past the pool
TABLE = [
    [14, NO_PAGE, NO_PAGE],  # A owns the last page, the one a clamped gather reads
    [0, 1, NO_PAGE],  # B
    [2, 3, 4],  # C
    [5, 6, 7],  # D
    [NO_PAGE] * 3,  # E: inactive
    [8, 9, NO_PAGE],  # F: the last row, where the ragged walk's dead items land
]
LENS = [3, 7, 12, 11, 0, 8]
# (poisoned flat slots, rows whose output they must not touch)
SCENARIOS = {
    "another_row": ([14 * PS], [1, 2, 3, 4, 5]),  # A's first token: A attends it, no one else
    "past_the_length": ([1 * PS + 3, 7 * PS + 3], [0, 1, 2, 3, 4, 5]),  # B's, D's stale tails
}
PATHS = ["ragged", "ragged_blocks", "gpu", "gathered"]


def _attend(path: str, q, pool, lens, table):
    """The output of `path`, float32: q [B, 2, N, H]; the decode paths take the last query,
    `gathered` both (the last two tokens of each row, as a tool turn's append)."""
    if path == "gathered":
        positions = lens[:, None] - 2 + jnp.arange(2)[None]
        out = paged.gathered_attention(q, pool, lens, table, positions, sm_scale=0.3)
    elif path == "gpu":
        out = paged.decode(q[:, 1], pool, lens, table, sm_scale=0.3, platform="gpu")
    else:  # the ragged walk, in one pass or in blocks
        out = paged.decode_attention(q[:, 1], pool, lens, table, sm_scale=0.3)
    return out.astype(jnp.float32)


def _pool(kv: np.ndarray, dtype: str):
    if dtype == "int8":
        return Int8Pages(*quantize_kv(jnp.asarray(kv)))
    return jnp.asarray(kv, dtype)


def _poison(pool, slots: list[int]):
    """NaN keys and infinite values (an overflow) written at `slots`, as the engine writes."""
    k = jnp.full((len(slots), K, H), jnp.nan, jnp.float32)
    v = jnp.full((len(slots), K, H), jnp.inf, jnp.float32)
    return paged.write_kv(pool, k, v, jnp.asarray(slots))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("path", PATHS)
def test_unattended_nonfinite_slots_leave_outputs_bit_identical(path, dtype, scenario, monkeypatch):
    if path == "ragged_blocks":  # blocks of 2 items: the last block has one dead item
        monkeypatch.setattr(paged, "BLOCK_TOKENS", 2 * PS)
    slots, rows = SCENARIOS[scenario]
    rng = np.random.RandomState(0)
    kv = rng.randn(P, PS, 2 * K, H).astype(np.float32)  # finite junk in every slot
    q = jnp.asarray(rng.randn(len(TABLE), 2, N, H), "float32" if dtype == "int8" else dtype)
    lens, table = jnp.asarray(LENS, jnp.int32), jnp.asarray(TABLE, jnp.int32)
    clean = _pool(kv, dtype)
    poisoned = _poison(clean, slots)
    read = np.asarray(take_pages(poisoned, jnp.asarray(slots) // PS))
    assert not np.isfinite(read).all()  # the poison survives the pool's dtype
    run = jax.jit(functools.partial(_attend, path))
    want, got = (np.asarray(run(q, pool, lens, table)) for pool in (clean, poisoned))
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got[rows], want[rows])
    if scenario == "another_row":  # the owner attends its NaN key: NaN shows there, on
        assert np.isnan(got[0]).all()  # every path (the walks' guard of inactive rows hid it)
