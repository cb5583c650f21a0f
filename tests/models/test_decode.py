"""Cached decoding (`CausalLM.extend`) equals full recomputation, token by token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import KVCache, ModelConfig, ValueModel, from_pretrained, init_model
from jaxrl_llm.testing import assert_as_accurate, float64_twin, jitted


def _full_logits(model, rows, width=24):
    """Logits of each row's last token by an uncached forward.

    Rows are right-padded to one width: under the causal mask, later (pad) tokens cannot
    change earlier logits, so one jitted shape serves every step.
    """
    padded = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        padded[b, : len(r)] = r
    graphdef, state = nnx.split(model)
    logits = _jit_forward(graphdef, state, jnp.asarray(padded))
    return np.asarray(logits)[np.arange(len(rows)), [len(r) - 1 for r in rows]]


def _assert_as_accurate(cached, model, rows, twin):
    """The cached logits are as accurate as the full forward's (trusted), both against the
    full forward of ``twin``, the model in float64 (`testing.assert_as_accurate`)."""
    with jax.enable_x64(True):
        exact = _full_logits(twin, rows)
    return assert_as_accurate(cached, _full_logits(model, rows), exact)


@jax.jit(static_argnums=0)
def _jit_forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
def test_cached_decode_matches_full_forward_mixed_lengths(qwen_checkpoint):
    path, _ = qwen_checkpoint
    model = from_pretrained(path)
    V = model.config.vocab_size
    rng = np.random.RandomState(0)
    lengths = np.array([3, 9, 6])
    T, S = 12, 32
    prompts = [list(rng.randint(0, V, n)) for n in lengths]
    padded = np.zeros((3, T), np.int32)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = p

    @jax.jit
    def step(state, cache, tokens, start, n):
        m = nnx.merge(graphdef, state)
        h, cache = m.extend(cache, tokens, start, n)
        return m.logits(h), cache

    graphdef, state = nnx.split(model)
    cache = KVCache.zeros(model.config, 3, S)
    start = jnp.zeros(3, jnp.int32)
    logits, cache = step(state, cache, jnp.asarray(padded), start, jnp.asarray(lengths))
    last = np.asarray(logits)[np.arange(3), lengths - 1]
    rows = [list(p) for p in prompts]
    with jax.enable_x64(True):
        twin = float64_twin(model)
    worst = _assert_as_accurate(last, model, rows, twin)

    pos = jnp.asarray(lengths, jnp.int32)
    for _ in range(8):
        nxt = last.argmax(-1)
        for r, t in zip(rows, nxt):
            r.append(int(t))
        logits, cache = step(state, cache, jnp.asarray(nxt[:, None]), pos, None)
        pos = pos + 1
        last = np.asarray(logits)[:, 0]
        worst = max(worst, _assert_as_accurate(last, model, rows, twin))
    print(f"error / bound: {worst:.2f}")


@pytest.mark.slow  # 2.5 s alone, AMD EPYC AVX2, jitted (2026-12-05); 10 s eager in a 2-worker run
def test_multi_token_append_matches_full_forward(qwen_checkpoint):
    """Appending a block (e.g. tool output) to a live row equals recomputing it."""
    path, _ = qwen_checkpoint
    model = from_pretrained(path)
    V = model.config.vocab_size
    rng = np.random.RandomState(1)
    first, second = list(rng.randint(0, V, 5)), list(rng.randint(0, V, 4))
    cache = KVCache.zeros(model.config, 1, 16)
    extend = jitted("extend")
    _, cache = extend(model, cache, jnp.asarray([first]), jnp.zeros(1, jnp.int32))
    h, cache = extend(model, cache, jnp.asarray([second]), jnp.asarray([5], jnp.int32))
    ours = np.asarray(jitted("logits")(model, h))[0]
    full = np.asarray(jitted()(model, jnp.asarray([first + second])))[0, 5:]
    with jax.enable_x64(True):  # trusted: the full forward; exact: the same in float64
        exact = np.asarray(jitted()(float64_twin(model), jnp.asarray([first + second])))[0, 5:]
    print(f"error / bound: {assert_as_accurate(ours, full, exact):.2f}")


@pytest.mark.slow  # 6 s alone, AMD EPYC AVX2, jitted (2026-12-05)
def test_bfloat16_cache_decode_is_finite_and_close():
    cfg = ModelConfig(dtype="bfloat16", param_dtype="bfloat16")
    model = init_model(cfg, seed=0)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 7)))
    cache = KVCache.zeros(cfg, 2, 8)
    assert cache.k.dtype == jnp.bfloat16
    h, cache = jitted("extend")(model, cache, ids, jnp.zeros(2, jnp.int32))
    cached = np.asarray(jitted("logits")(model, h))
    full = np.asarray(jitted()(model, ids))
    assert np.isfinite(cached).all()
    # `testing.assert_as_accurate`'s rule at bfloat16's precision (that helper is for float32
    # programs and refuses a trusted error above 1e-3 relative): the cached logits within 4x
    # the full forward's error against the float64 twin, plus one bfloat16 rounding.
    with jax.enable_x64(True):
        exact = np.asarray(jitted()(float64_twin(model), ids))
    err = lambda x: np.abs(np.asarray(x, np.float64) - exact).max()
    bound = 4 * err(full) + float(jnp.finfo(jnp.bfloat16).eps) * np.abs(exact).max()
    assert err(cached) <= bound, (err(cached), err(full), bound)


@pytest.mark.slow  # 12 s in a loaded 2-worker run, AMD EPYC AVX2
def test_value_model_from_policy_checkpoint(qwen_checkpoint, tmp_path):
    from transformers import AutoModelForTokenClassification

    from jaxrl_llm.models import save_pretrained

    path, _ = qwen_checkpoint
    critic = from_pretrained(path, cls=ValueModel)
    policy = from_pretrained(path)
    ids = jnp.asarray(np.random.RandomState(2).randint(0, critic.config.vocab_size, (2, 10)))
    values = np.asarray(critic(ids))
    assert values.shape == (2, 10)
    np.testing.assert_array_equal(values, 0.0)  # zero-initialised head
    np.testing.assert_array_equal(
        np.asarray(critic.hidden_states(ids)), np.asarray(policy.hidden_states(ids))
    )
    # A trained head round-trips through HF's token-classification layout.
    critic.score[...] = jax.random.normal(jax.random.key(0), critic.score.shape)
    critic.score_bias[...] = jnp.asarray([0.3])
    save_pretrained(critic, tmp_path / "critic")
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").eval()
    import torch

    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(np.asarray(ids))).logits[..., 0].numpy()
    with jax.enable_x64(True):  # trusted: transformers' float32 values; exact: ours in float64
        exact = np.asarray(float64_twin(critic)(ids))
    print(f"error / bound: {assert_as_accurate(np.asarray(critic(ids)), ref, exact):.2f}")
    again = from_pretrained(tmp_path / "critic", cls=ValueModel)
    # The float32 weights round-trip bit for bit and both run one (eager) program: equal.
    assert again.config == critic.config
    np.testing.assert_array_equal(np.asarray(again(ids)), np.asarray(critic(ids)))
