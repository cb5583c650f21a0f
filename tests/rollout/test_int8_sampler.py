"""`RolloutConfig.weights = 'int8' | 'w8a8'` (issue #30, item 1): the sampler's copy of the
policy has int8 projections, embedding and LM head, quantised from the trainer's float
weights at each push. 'int8' samples what the float model with the dequantised weights
samples (the engine computes (x W_q) s, the reference x (W_q s): the same product in another
order); 'w8a8' decodes what its own uncached forward computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.models import from_pretrained, int8_cpu, load_tokenizer
from jaxrl_llm.models.lora import LoraConfig, apply_lora, split_adapters
from jaxrl_llm.models.quant import (
    INT8_ACTIVATIONS,
    SCALE_SUFFIX,
    int8_product,
    int8_projections,
    int8_sampler_model,
    quantize_int8,
    quantize_projections,
)
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.sampler import SamplerContext
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.sharding.mesh import build_mesh
from jaxrl_llm.testing import assert_as_accurate, float64_twin, jitted, randomise_lora_b
from tests.rollout.reference import full_logits


def _flat(state) -> dict:
    return {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}


def _dq(name: str, q, scale):
    """q * scale for the weight `name`, in the scale's dtype (float32, or float64: exact): the
    embedding [V, D] has one scale per row, every other int8 weight one per output
    (trailing) channel."""
    scale = np.asarray(scale)
    q = np.asarray(q, np.promote_types(scale.dtype, np.float32))
    return q * (scale[:, None] if name.endswith("embed_tokens") else scale)


def _dequantised(policy: nnx.Module) -> nnx.Module:
    """`policy` with every weight the sampler quantises replaced by its int8 round trip, in
    float32."""
    model = int8_projections(nnx.clone(policy))
    for _, module in nnx.iter_modules(model):
        for name in [k for k in vars(module) if k.endswith(SCALE_SUFFIX)]:
            weight = name.removesuffix(SCALE_SUFFIX)
            scale = getattr(module, name).get_value()
            getattr(module, weight).set_value(_dq(weight, getattr(module, weight)[...], scale))
            delattr(module, name)
    return model


def _exactly_dequantised(policy: nnx.Module) -> nnx.Module:
    """The int8 sampler's computation in float64 (call under ``jax.enable_x64``): a float64
    model whose quantised weights are q * s exactly, where `_dequantised` rounds them to
    float32. The exact value the int8 program rounds from."""
    int8 = dict(nnx.iter_modules(int8_projections(nnx.clone(policy))))
    twin = float64_twin(_dequantised(policy))
    for path, module in nnx.iter_modules(twin):
        for name in [k for k in vars(int8[path]) if k.endswith(SCALE_SUFFIX)]:
            weight = name.removesuffix(SCALE_SUFFIX)
            q, scale = getattr(int8[path], weight)[...], getattr(int8[path], name)[...]
            exact = _dq(weight, np.asarray(q, np.float64), np.asarray(scale, np.float64))
            getattr(module, weight).set_value(jnp.asarray(exact, jnp.float64))
    return twin


def _quantised_count(policy) -> int:
    """Weights the sampler stores as int8: 7 projections a layer, the embedding and an
    untied LM head."""
    return 7 * policy.config.num_layers + 1 + (not policy.config.tie_word_embeddings)


def _sampler(policy, tokenizer, weights: str, mesh=None) -> JaxSampler:
    cfg = RolloutConfig(max_new_tokens=12, max_slots=4, weights=weights)
    return JaxSampler(SamplerContext(cfg, policy, tokenizer, mesh, None, max_prompt_length=16))


def test_the_synced_tree_is_the_engines_and_the_modules():
    """The sync's quantisation of a State gives the tree the engine compiled for (paths,
    shapes, dtypes) and the values `int8_projections` stores on a module; every projection
    is int8 within half a scale step, and nothing else changes."""
    policy = from_pretrained(builtin_checkpoint())
    synced = _flat(jax.jit(quantize_projections)(nnx.state(policy)))
    abstract = _flat(nnx.state(int8_sampler_model(policy)))
    module = _flat(nnx.state(int8_projections(nnx.clone(policy))))
    floats = _flat(nnx.state(policy))
    assert synced.keys() == abstract.keys() == module.keys()
    scales = [k for k in synced if k.endswith(SCALE_SUFFIX)]
    assert len(scales) == _quantised_count(policy)
    for key, value in synced.items():
        assert (value.shape, value.dtype) == (abstract[key].shape, abstract[key].dtype), key
        np.testing.assert_array_equal(value, module[key], err_msg=key)
    for key in scales:
        weight = key.removesuffix(SCALE_SUFFIX)
        assert synced[weight].dtype == jnp.int8
        step = _dq(weight, np.ones_like(synced[weight]), synced[key])  # s, as broadcast
        err = np.abs(np.asarray(_dq(weight, synced[weight], synced[key])) - floats[weight])
        # half a step, plus the float32 rounding of q * s (a unit in the last place of w)
        bound = np.asarray(step) / 2 + np.abs(floats[weight]) * np.finfo(np.float32).eps
        assert (err <= bound).all(), (weight, float((err - bound).max()))
    for key in floats.keys() - {k.removesuffix(SCALE_SUFFIX) for k in scales}:
        np.testing.assert_array_equal(synced[key], floats[key], err_msg=key)


@pytest.fixture(params=["xla", "kernel"])
def int8_path(request, monkeypatch):
    """Weight-only int8 products by XLA (the int8 CPU kernel off), or by the kernel for
    every weight (its size threshold lowered to the tiny model's weights)."""
    if request.param == "xla":
        monkeypatch.setenv(int8_cpu.ENV_SWITCH, "0")
    elif int8_cpu.target_name() is None:
        pytest.skip("no C++ compiler: the int8 CPU kernel cannot be built")
    else:
        monkeypatch.setattr(int8_cpu, "MIN_WEIGHT_ELEMENTS", 0)
    return request.param


@pytest.mark.slow  # 9-11 s each, Intel Xeon, nothing else running
@pytest.mark.parametrize("fsdp", [1, 4])
def test_int8_sampling_equals_the_dequantised_float_model(fsdp, int8_path):
    """Greedy tokens of the int8 sampler equal those of the float sampler holding the
    dequantised weights; their logprobs are as accurate as the float sampler's against the
    dequantised model's float64 forward on the same tokens (`testing.assert_as_accurate`:
    the int8 engine computes (x W_q) s, the float one x (W_q s), the same product in
    another order; the int8 and the original float weights differ by 1.4e-2 to 6.2e-2 on
    these prompts). Sharded over fsdp=4 as well: the scales are laid out by their logical
    axes. Decoding by XLA's product and by the int8 CPU kernel (`int8_path`)."""
    mesh = build_mesh(fsdp=fsdp, devices=jax.devices()[:fsdp])
    path = builtin_checkpoint()
    policy, tokenizer = from_pretrained(path, mesh=mesh), load_tokenizer(path)
    int8 = _sampler(policy, tokenizer, "int8", mesh)
    int8.push_weights(nnx.state(policy), version=3)
    assert int8.policy_version == 3
    leaves = jax.tree.leaves(int8.params)
    assert sum(x.dtype == jnp.int8 for x in leaves) == _quantised_count(policy)
    dequantised = _dequantised(policy)
    reference = _sampler(dequantised, tokenizer, "same", mesh)
    reference.push_weights(nnx.state(dequantised))
    prompts = [np.asarray(tokenizer(q)["input_ids"], np.int32)
               for q in ("What is 3 + 4?", "Name a prime.", "2, 4, 8, next?")]  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, raw_logprobs=True)
    got, want = int8.generate(prompts, greedy), reference.generate(prompts, greedy)
    # Exact values, teacher-forced on the tokens: the int8 program's (q * s in float64) and
    # the float program's (its float32 weights, upcast).
    exact: dict[str, list] = {"int8": [], "float": []}
    with jax.enable_x64(True):
        twins = {"int8": _exactly_dequantised(policy), "float": float64_twin(dequantised)}
        for prompt, a, b in zip(prompts, got, want, strict=True):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            tokens = list(a.token_ids)
            rows = [np.concatenate([prompt, tokens[:t]]) for t in range(len(tokens))]
            for kind, twin in twins.items():
                logp = np.asarray(jax.nn.log_softmax(full_logits(twin, rows), axis=-1))
                exact[kind].append(logp[np.arange(len(tokens)), tokens])
    logprobs = lambda samples: np.concatenate([x.raw_logprobs for x in samples])
    exact_int8, exact_float = (np.concatenate(exact[k]) for k in ("int8", "float"))
    # The int8 engine's worst logprob errs 3.0x the float engine's here (fsdp 1; 1.6x at
    # fsdp 4): a product of integers scaled after the sum rounds more than the float one.
    kw = dict(trusted_exact=exact_float, factor=8.0)
    assert_as_accurate(logprobs(got), logprobs(want), exact_int8, **kw)
    # the two exact values differ by the float32 rounding of q * s alone
    assert_as_accurate(exact_int8, logprobs(want), exact_float)


def test_vllm_refuses_int8_before_loading_anything():
    from jaxrl_llm.rollout.vllm_sampler import VllmSampler

    ctx = SamplerContext(RolloutConfig(weights="int8"), None, None, None, None, 16)
    with pytest.raises(ConfigError, match=r"rollout.weights = 'int8'.*vLLM.*quantization"):
        VllmSampler(ctx)


def test_vllm_refuses_an_int8_kv_cache_before_loading_anything():
    from jaxrl_llm.rollout.vllm_sampler import VllmSampler

    ctx = SamplerContext(RolloutConfig(kv_cache_dtype="int8"), None, None, None, None, 16)
    with pytest.raises(ConfigError, match=r"rollout.kv_cache_dtype = 'int8'.*vLLM"):
        VllmSampler(ctx)
    with pytest.raises(ValueError, match=r"kv_cache_dtype.*auto.*bfloat16.*int8"):
        RolloutConfig(kv_cache_dtype="fp8")


def test_a_bad_weights_value_names_the_choices():
    with pytest.raises(ValueError, match=r"weights.*same.*int8"):
        RolloutConfig(weights="fp8")


@pytest.mark.slow  # 6-8 s each, Intel Xeon, nothing else running
@pytest.mark.parametrize("lora", [False, True])
def test_w8a8_decoding_equals_full_recomputation(lora):
    """'w8a8': the sampler's cached decoding is the W8A8 model's own uncached forward on the
    whole sequence (teacher-forced on the sampler's tokens). W8A8 rounds every activation,
    a step function, so the ~1e-6 that cached and full attention differ by in float32
    summation order can move a value across a rounding boundary; one such flip moves a
    logprob by up to a few 1e-2 here. So: most tokens agree to 1e-4, every token to 0.1,
    and each greedy token is the full forward's argmax wherever its top-2 margin exceeds
    that. With LoRA (trained, non-zero adapters) the sampler's base is int8 and its
    adapters float, and only the sampler's copy quantises activations: the trainer's
    modules are left as they were."""
    path = builtin_checkpoint()
    policy, tokenizer = from_pretrained(path), load_tokenizer(path)
    if lora:
        apply_lora(policy, LoraConfig(rank=2, alpha=4.0), seed=0)
        randomise_lora_b(policy)
    sampler = _sampler(policy, tokenizer, "w8a8")
    sampler.push_weights(nnx.state(policy))
    assert not any(hasattr(m, INT8_ACTIVATIONS) for _, m in nnx.iter_modules(policy))
    adapters, _ = split_adapters(sampler.params)
    assert {x.dtype for x in jax.tree.leaves(adapters)} <= {jnp.dtype(jnp.float32)}
    assert len(jax.tree.leaves(adapters)) == (14 * policy.config.num_layers if lora else 0)
    w8a8 = int8_projections(nnx.clone(policy), activations=True)
    prompts = [np.asarray(tokenizer(q)["input_ids"], np.int32)
               for q in ("What is 3 + 4?", "2, 4, 8, next?")]  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, raw_logprobs=True)
    diffs = []
    for prompt, got in zip(prompts, sampler.generate(prompts, greedy), strict=True):
        tokens = list(got.token_ids)
        rows = [np.concatenate([prompt, tokens[:t]]) for t in range(len(tokens))]
        logp = np.asarray(jax.nn.log_softmax(full_logits(w8a8, rows), axis=-1))
        diffs += list(np.abs(got.raw_logprobs - logp[np.arange(len(tokens)), tokens]))
        top2 = np.sort(logp, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 0.1
        np.testing.assert_array_equal(np.asarray(tokens)[clear], logp.argmax(-1)[clear])
    assert np.median(diffs) <= 1e-4 and max(diffs) <= 0.1, diffs


@pytest.mark.slow  # 2-9 s each, AMD EPYC AVX2, jitted (2026-12-05)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("rows", [18, 10])
def test_int8_logits_equal_the_dequantised_model_tied_or_not(tied, rows, int8_path):
    """Weight-only int8 logits of a whole forward (embedding lookup, projections, the LM
    head: the tied embedding's rows or an untied [D, V] head) equal the dequantised float
    model's to float32 rounding of a reordered product: as accurate as the float model's
    against its float64 twin (`testing.assert_as_accurate`); quantising moves them by
    5-7e-3 of the largest logit. 18 rows take XLA's product; 10 the int8 CPU kernel's on
    the `kernel` path (`int8_cpu.MAX_ROWS`)."""
    from jaxrl_llm.models import ModelConfig, init_model

    cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8,
                      tie_word_embeddings=tied)  # fmt: skip
    policy = init_model(cfg, seed=0)
    int8 = int8_projections(nnx.clone(policy))
    owner, name = (int8.model, "embed_tokens") if tied else (int8, "lm_head")
    assert getattr(owner, name)[...].dtype == jnp.int8 and hasattr(owner, name + SCALE_SUFFIX)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 97, (2, rows // 2)), jnp.int32)
    dequantised = _dequantised(policy)
    graph, state = nnx.split(int8)
    own = jax.jit(lambda state, ids: nnx.merge(graph, state)(ids))  # traced for this path
    kernel = "jaxrl_int8_matmul" in own.lower(state, ids).as_text()
    assert kernel == (int8_path == "kernel" and rows <= int8_cpu.MAX_ROWS)
    forward = jitted()
    got, want = np.asarray(own(state, ids)), np.asarray(forward(dequantised, ids))
    with jax.enable_x64(True):
        exact_int8 = np.asarray(forward(_exactly_dequantised(policy), ids))
        exact_float = np.asarray(forward(float64_twin(dequantised), ids))
    assert_as_accurate(got, want, exact_int8, trusted_exact=exact_float)
    assert_as_accurate(exact_int8, want, exact_float)  # q * s's float32 rounding alone
    assert np.abs(got - np.asarray(forward(policy, ids))).max() > 1e-3 * np.abs(want).max()


def test_int8_product_is_its_formula_and_pads_single_rows():
    """`int8_product` equals its formula computed in float64 from the same int8 operands
    (the int32 sum is exact; only the final scaling rounds: a few float32 ulps), and one row
    alone (padded to 8 inside) gives what it gives among 8."""
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.randn(8, 1, 64).astype(np.float32) * rng.rand(8, 1, 1) * 10)
    q, scale = quantize_int8(jnp.asarray(rng.randn(64, 48).astype(np.float32)), 1)
    got = np.asarray(int8_product("btd,df->btf", x, q, scale, 1))
    x64 = np.asarray(x, np.float64)
    sx = np.abs(x64).max(-1, keepdims=True) / 127
    xq = np.clip(np.round(x64 / sx), -127, 127)
    want = (xq @ np.asarray(q, np.float64)) * sx * np.asarray(scale, np.float64)
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(np.float32).eps, atol=0)
    single = np.asarray(int8_product("btd,df->btf", x[3:4], q, scale, 1))
    np.testing.assert_array_equal(single, got[3:4])
