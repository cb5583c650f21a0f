"""Every public function: jits, vmap == per-slice jitted calls, bfloat16 inputs finite.

vmap == per-slice: the vmapped float32 result is as accurate as the per-slice one, both
measured against the plain function run in float64 on the same inputs
(`testing.assert_as_accurate`, issue #26), not within a fixed tolerance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.testing import assert_as_accurate

B, T, V, G = 4, 5, 7, 2
_rng = np.random.default_rng(0)
_f = lambda *shape, scale=1.0: (_rng.normal(size=shape) * scale).astype(np.float32)
MASK = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], np.float32)
LOGP = -np.abs(_f(B, T))
OLD = LOGP + 0.2 * _f(B, T)
HEAD = _f(3, V)  # an LM head [D, V]

# name -> (function of arrays only, float inputs, integer inputs)
CASES = {
    "grpo_advantages": (lambda r: alg.grpo_advantages(r, G), (_f(B),), ()),
    "dr_grpo_advantages": (lambda r: alg.grpo_advantages(r, G, norm_by_std=False), (_f(B),), ()),
    "rloo_advantages": (lambda r: alg.rloo_advantages(r, G), (_f(B),), ()),
    "reinforce_pp": (
        lambda r, m: alg.reinforce_pp_advantages(r, m, gamma=0.9),
        (_f(B, T), MASK),
        (),
    ),
    "reinforce_pp_baseline": (
        lambda r, m: alg.reinforce_pp_advantages(r, m, baseline_group_size=G),
        (_f(B, T), MASK),
        (),
    ),
    "gae_advantages": (
        lambda r, v, m: alg.gae_advantages(r, v, m, gamma=0.99, lam=0.95),
        (_f(B, T), _f(B, T), MASK),
        (),
    ),
    "outcome_token_rewards": (alg.outcome_token_rewards, (_f(B), MASK), ()),
    "kl_shaped_rewards": (
        lambda s, lp, ref, m: alg.kl_shaped_rewards(s, lp, ref, m, kl_coef=0.05),
        (_f(B, T), LOGP, OLD, MASK),
        (),
    ),
    "kl_penalty": (
        lambda lp, ref: {k: alg.kl_penalty(lp, ref, k) for k in ("k1", "abs", "k2", "k3")},
        (LOGP, OLD),
        (),
    ),
    "aggregate_loss": (
        lambda x, m: {mode: alg.aggregate_loss(x, m, mode) for mode in alg.available("loss_agg")},
        (_f(B, T), MASK),
        (),
    ),
    "policy_loss": (
        lambda lp, old, a, m: alg.policy_loss(lp, old, a, m, clip_high=0.28, dual_clip_c=3.0),
        (LOGP, OLD, _f(B, T), MASK),
        (),
    ),
    "gspo_policy_loss": (alg.gspo_policy_loss, (LOGP, OLD, _f(B), MASK), ()),
    "value_loss": (alg.value_loss, (_f(B, T), _f(B, T), _f(B, T), MASK), ()),
    "token_logprobs": (
        lambda lg, tk: alg.token_logprobs(lg, tk, temperature=0.8, chunk_size=2),
        (_f(B, T, V, scale=4.0),),
        (_rng.integers(0, V, size=(B, T)),),
    ),
    "entropy": (lambda lg: alg.entropy(lg, chunk_size=2), (_f(B, T, V, scale=4.0),), ()),
    "head_logprobs": (
        lambda h, m, tk: alg.head_logprobs(
            h, tk, m, lambda x: x @ HEAD, temperature=0.8, chunk_size=2, entropy="loss"
        ),
        (_f(B, T, 3, scale=2.0), MASK),
        (_rng.integers(0, V, size=(B, T)),),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_vmap_and_bfloat16(name):
    fn, floats, ints = CASES[name]
    # three differently scaled copies stacked on a new leading axis
    scales = (1.0, 0.5, -1.0)
    stacked = [np.stack([x if x is MASK else x * s for s in scales]) for x in floats]
    stacked += [np.stack([x] * 3) for x in ints]

    n_float = len(floats)

    @jax.jit  # one compile: vmapped, per-slice and bfloat16 calls together
    def run(*xs):
        bf16 = [x[0].astype(jnp.bfloat16) for x in xs[:n_float]] + [x[0] for x in xs[n_float:]]
        return jax.vmap(fn)(*xs), [fn(*(x[i] for x in xs)) for i in range(3)], fn(*bf16)

    batched, sliced, from_bf16 = run(*map(jnp.asarray, stacked))
    with jax.enable_x64(True):  # exact: the plain function on each slice, upcast, in float64
        wide = [x.astype(np.float64) for x in stacked[:n_float]] + stacked[n_float:]
        fn64 = jax.jit(fn)
        exact = [jax.device_get(fn64(*(x[i] for x in wide))) for i in range(3)]
    assert jax.tree.structure(batched) == jax.tree.structure(exact[0]), name
    # got: the vmapped float32 call; trusted: the per-slice float32 call; exact: float64.
    worst = max(
        assert_as_accurate(jax.tree.map(lambda a, i=i: a[i], batched), sliced[i], exact[i])
        for i in range(3)
    )
    print("error / bound:", round(worst, 2))
    for leaf in jax.tree.leaves(from_bf16):  # bfloat16 inputs: finite results
        assert np.all(np.isfinite(np.asarray(leaf, np.float32))), name
