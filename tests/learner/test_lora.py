"""LoRA (`models.lora`, `learner.lora`): adapters start at the base and merge exactly, are
laid out like their weights, are the only trained leaves (their gradient is the chain rule
of the full one), switch off for the reference; bad configs name the field. Two float32
programs of one computation are compared as `testing.assert_as_accurate` does: each as
accurate as the trusted one against the same computation in float64 (`_float64_twin`)."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.lora import full_params, split_trainable
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import make_policy_step, to_micro_batches
from jaxrl_llm.models import init_model
from jaxrl_llm.models.lora import (
    LoraConfig,
    adapters,
    adapters_off,
    apply_lora,
    merge_adapters,
    split_adapters,
)
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
from jaxrl_llm.sharding.rules import logical_sharding
from jaxrl_llm.testing import assert_as_accurate, jitted, randomise_lora_b, tiny_config

from .test_steps import ALGO, B, _batch, _exact_policy

CFG = tiny_config()


def _ids(seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, (2, 9)), jnp.int32)


def _float64_twin(model, lora: LoraConfig):
    """`testing.float64_twin` of a model carrying `lora`'s adapters (and int8 base): a
    float64 model of its config given the same adapters (`apply_lora`), then every variable
    of `model` copied in, float32 ones upcast (exactly), int8 weights as they are. Build and
    call it under `jax.enable_x64(True)`. Built abstract (`nnx.eval_shape`), then filled:
    an eager random init in float64 would compile its ops for seconds."""
    cfg = dataclasses.replace(model.config, dtype="float64", param_dtype="float64")

    def build():
        twin = type(model)(cfg, rngs=nnx.Rngs(0))
        apply_lora(twin, lora, seed=0)
        return twin

    twin = nnx.eval_shape(build)
    wide = lambda x: jnp.float64 if x.dtype == jnp.float32 else x.dtype
    up = lambda x: jnp.asarray(np.asarray(jax.device_get(x)), wide(x))
    nnx.update(twin, jax.tree.map(up, nnx.state(model)))
    return twin


def _exact_forward(model, lora: LoraConfig, ids) -> np.ndarray:
    """`model(ids)` computed in float64 (`_float64_twin`; jitted: faster than eager)."""
    with jax.enable_x64(True):
        return np.asarray(jitted()(_float64_twin(model, lora), ids))


@pytest.mark.slow  # 35 s in a loaded 2-worker run, AMD EPYC AVX2
def test_adapters_start_at_base_merge_exactly_and_switch_off():
    model = init_model(CFG, seed=1)
    base = model(_ids())
    lora = LoraConfig(rank=4, alpha=8.0)
    assert apply_lora(model, lora, seed=0) == 7 * CFG.num_layers
    np.testing.assert_allclose(model(_ids()), base, rtol=0, atol=0)  # B = 0: exactly the base
    randomise_lora_b(model)
    adapted = model(_ids())
    assert np.abs(np.asarray(adapted - base)).max() > 1e-2
    graphdef, ads, rest = nnx.split(model, nnx.LoRAParam, ...)
    off = nnx.merge(graphdef, adapters_off(ads), rest)
    np.testing.assert_array_equal(off(_ids()), base)  # A = B = 0: x W + 0, exactly the base
    exact = _exact_forward(model, lora, _ids())
    merged = merge_adapters(nnx.merge(graphdef, ads, rest))
    assert not any(True for _ in adapters(merged))
    # trusted: the adapters applied, x W + s (x A) B; exact: the same in float64
    worst = assert_as_accurate(merged(_ids()), adapted, exact)
    print(f"merged error / bound = {worst:.2f}")


def test_targets_select_weights_by_name_or_path():
    model = init_model(CFG, seed=1)
    cfg = LoraConfig(rank=2, targets=("q_proj", r"model/layers/1/mlp/down_proj"))
    assert apply_lora(model, cfg, seed=0) == CFG.num_layers + 1
    paths = sorted(ad.path for ad in adapters(model))
    assert paths == [
        "model/layers/0/self_attn/q_proj",
        "model/layers/1/mlp/down_proj",
        "model/layers/1/self_attn/q_proj",
    ]


def test_bad_lora_configs_name_the_field():
    with pytest.raises(ConfigError, match=r"LoraConfig\.rank"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match=r"LoraConfig\.targets"):
        LoraConfig(targets=())
    with pytest.raises(ValueError, match=r"LoraConfig\.targets.*no weight matched"):
        apply_lora(init_model(CFG, seed=1), LoraConfig(targets=("qproj",)), seed=0)


def _assert_laid_out_by_logical_axes(model, mesh, suffixes: tuple[str, ...]) -> None:
    """Each targeted weight's variables named `name + suffix` are sharded as their logical
    axes say under TRAIN_RULES on `mesh`."""
    for ad in adapters(model):
        for suffix in suffixes:
            var = getattr(ad.module, ad.name + suffix)
            want = logical_sharding(
                var.get_metadata()["logical_axes"], TRAIN_RULES, mesh, var.shape
            )
            assert var.get_value().sharding.is_equivalent_to(want, var.ndim), (ad.path, suffix)


@pytest.mark.slow  # 12 s in a loaded 2-worker run, AMD EPYC AVX2
def test_adapters_are_laid_out_like_their_weights():
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    model = init_model(CFG, seed=1, mesh=mesh)
    apply_lora(model, LoraConfig(rank=4), seed=0)
    _assert_laid_out_by_logical_axes(model, mesh, ("_lora_a", "_lora_b"))
    q = next(ad for ad in adapters(model) if ad.path == "model/layers/0/self_attn/q_proj")
    a, b = (getattr(q.module, q.name + suffix) for suffix in ("_lora_a", "_lora_b"))
    assert a.get_metadata()["logical_axes"] == ("embed", None)
    assert b.get_metadata()["logical_axes"] == (None, "heads", "head_dim")
    assert a.get_value().sharding.spec[0] == "fsdp"  # as q_proj's embed dim


def _step(graphdef, params, frozen, lr):
    tx = optax.sgd(lr)
    state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.PRNGKey(0))
    step = make_policy_step(graphdef, tx, ALGO, temperature=0.8)
    batch = to_micro_batches(_batch(), jnp.arange(B), 4)
    return state, step(state, batch, None, frozen)


@pytest.mark.slow  # 39 s in a loaded 2-worker run, AMD EPYC AVX2
def test_only_adapters_train_and_their_gradient_is_the_chain_rule():
    """At B = 0 the LoRA step sees the base model: same losses as the full step, and
    dL/dB = (alpha / r) A^T dL/dW, dL/dA = 0 (checked through one SGD update each)."""
    lr, lora = 0.1, LoraConfig(rank=4, alpha=8.0)
    full_gd, full_params_, _, _ = split_trainable(init_model(CFG, seed=1), None, seed=0,
                                                  reference=False)  # fmt: skip
    _, (full_state, full_m) = _step(full_gd, full_params_, None, lr)
    graphdef, params, frozen, ref = split_trainable(
        init_model(CFG, seed=1), lora, seed=0, reference=True
    )
    assert all(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(params, is_leaf=_is_var))
    frozen_before = jax.tree.map(np.asarray, frozen)
    _, (state, m) = _step(graphdef, params, frozen, lr)  # donates a copy of `params`
    # Optimiser state of the adapters only: SGD keeps none; the trained leaves are adapters.
    assert jax.tree.structure(state.params) == jax.tree.structure(params)
    # The full step in float64 (`test_steps._exact_policy`: the same model, batch, split,
    # and SGD at lr = 0.1): the exact metrics, and the exact full update for the chain rule.
    exact_params, exact_m = _exact_policy(init_model(CFG, seed=1), _batch(), 4)
    worst = {}
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        # trusted: the full step's metric; exact: the full step in float64 (one number)
        worst[k] = assert_as_accurate(m[k], full_m[k], exact_m[k], factor=16.0)
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(frozen_before), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)  # the base is untouched
    new = nnx.merge(graphdef, state.params, frozen)
    old_full = nnx.merge(full_gd, full_params_)
    new_full = nnx.merge(full_gd, full_state.params)
    got_b, want_b, exact_b = {}, {}, {}
    for ad in adapters(new):
        mod_path = ad.path.split("/")
        w_old = _get(old_full, mod_path).get_value()
        grad_w = (w_old - _get(new_full, mod_path).get_value()) / lr
        a0 = _get(nnx.merge(graphdef, params, frozen), [*mod_path[:-1], ad.name + "_lora_a"])
        dims = (tuple(range(ad.a.ndim - 1)),) * 2
        want_b[ad.path] = -lr * ad.scale * jnp.tensordot(a0.get_value(), grad_w, dims)
        got_b[ad.path] = ad.b
        w_new64 = np.asarray(_get(exact_params, mod_path).get_value(), np.float64)
        grad_w64 = (np.asarray(w_old, np.float64) - w_new64) / lr
        a64 = np.asarray(a0.get_value(), np.float64)
        exact_b[ad.path] = -lr * ad.scale * np.tensordot(a64, grad_w64, dims)
        np.testing.assert_allclose(ad.a, a0.get_value(), rtol=0, atol=0, err_msg=ad.path)
    # trusted: the chain rule on the full step's float32 update; exact: on its float64 update
    worst["B"] = assert_as_accurate(got_b, want_b, exact_b)
    print("error / bound:", {k: round(float(v), 2) for k, v in worst.items()})
    # The reference is the base: the adapters zeroed, the same frozen arrays.
    assert ref is not None  # asked for
    ref_ads, ref_base = split_adapters(ref)
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(ref_ads))
    assert all(a is b for a, b in zip(jax.tree.leaves(ref_base), jax.tree.leaves(frozen)))
    whole = full_params(state.params, frozen)
    assert len(jax.tree.leaves(whole)) == len(jax.tree.leaves(params)) + len(
        jax.tree.leaves(frozen)
    )


def _is_var(x):
    return isinstance(x, nnx.Variable)


def _get(model, path) -> Any:
    node = model
    for p in path:
        node = node[int(p)] if p.isdigit() else getattr(node, p)
    return node


def test_planner_counts_the_adapters_apply_lora_makes():
    """`plan_lora.adapter_bytes` (shapes only) agrees with the adapters `apply_lora` attaches, and
    the LoRA plan's optimiser and gradient terms are those of the adapters alone."""
    from jaxrl_llm.learner.plan import Workload, plan_memory
    from jaxrl_llm.learner.plan_lora import adapter_bytes
    from jaxrl_llm.learner.plan_shapes import abstract_mesh

    lora = LoraConfig(rank=4, targets=("q_proj", "down_proj"))
    model = init_model(CFG, seed=1)
    apply_lora(model, lora, seed=0)
    made = split_adapters(nnx.state(model))[0]
    sizes = [int(x.size) for x in jax.tree.leaves(made)]
    per_device, count = adapter_bytes(CFG, abstract_mesh(1, 1, 1), TRAIN_RULES, lora)
    assert count == sum(sizes) and per_device == 4 * sum(sizes)
    w = Workload(micro_batch=2, seq_len=16, reference=True, lora=lora)
    plan = plan_memory(CFG, (1, 1, 1), w)
    assert plan.terms["optimizer"] == 2 * per_device
    assert plan.terms["reference"] == 0  # the base with adapters off
    full = plan_memory(CFG, (1, 1, 1), Workload(micro_batch=2, seq_len=16, reference=True))
    assert plan.terms["params"] == full.terms["params"] + per_device


# The first four were the configs the LoRA activation term was fitted on; the fifth was not.
@pytest.mark.slow  # XLA compiles five steps: about 40 s on 2 cores
@pytest.mark.parametrize(
    "mesh_shape, micro_batch, seq_len, micro_batches, rank",
    [((1, 1, 1), 4, 96, 1, 16), ((1, 1, 1), 8, 96, 1, 16), ((1, 1, 1), 8, 64, 1, 16),
     ((1, 2, 2), 4, 128, 4, 16), ((2, 2, 1), 8, 64, 1, 8)],
    ids=["tiny-mb4", "tiny-mb8", "small", "small-fsdp2-tensor2", "small-data2-fsdp2"],
)  # fmt: skip
def test_lora_plan_within_20_percent_of_xla(mesh_shape, micro_batch, seq_len, micro_batches, rank):
    from jaxrl_llm.learner.plan import Workload, plan_memory
    from jaxrl_llm.learner.plan_check import xla_step_bytes
    from jaxrl_llm.learner.plan_shapes import model_config
    from jaxrl_llm.models import ModelConfig

    small = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip
    cfg = model_config("builtin") if seq_len == 96 else small
    n = mesh_shape[0] * mesh_shape[1] * mesh_shape[2]
    mesh = build_mesh(*mesh_shape, devices=jax.devices()[:n])
    work = Workload(micro_batch, seq_len, micro_batches, lora=LoraConfig(rank=rank))
    xla = xla_step_bytes(cfg, mesh, work)["total"]
    plan = plan_memory(cfg, mesh_shape, work)
    assert plan.train_step == pytest.approx(xla, rel=0.20), (plan.train_step, xla)
    full = plan_memory(cfg, mesh_shape, Workload(micro_batch, seq_len, micro_batches))
    trained = plan.terms["optimizer"] + plan.terms["grads"]
    assert trained < full.terms["optimizer"] + full.terms["grads"]


@pytest.mark.slow  # 21 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_scanned_layers_run_the_adapters_and_refuse_uneven_targets():
    ids, outs, models = _ids(), [], []
    for scan in (False, True):
        model = init_model(tiny_config(scan_layers=scan), seed=1)
        apply_lora(model, LoraConfig(rank=4), seed=0)
        randomise_lora_b(model)
        outs.append(np.asarray(model(ids)))
        models.append(model)
    # trusted: the unrolled layers; exact: the same in float64
    exact = _exact_forward(models[0], LoraConfig(rank=4), ids)
    worst = assert_as_accurate(outs[1], outs[0], exact)
    print(f"scanned error / bound = {worst:.2f}")
    scanned = init_model(tiny_config(scan_layers=True), seed=1)
    with pytest.raises(ValueError, match="scan_layers"):
        apply_lora(scanned, LoraConfig(targets=(r"model/layers/0/self_attn/q_proj",)), seed=0)


@pytest.mark.slow  # 20 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_int8_base_is_the_dequantised_model_and_merges():
    """`quantize_base='int8'`: targeted weights stored as int8 (each within half a scale
    step of the float weight); the model computes what the dequantised float model computes
    (as accurately, against each one's float64 run); merging folds adapters into the
    dequantised weights; only adapters train."""
    from jaxrl_llm.models.quant import dequantize

    lora = LoraConfig(rank=4, alpha=8.0, quantize_base="int8")
    float_model = init_model(CFG, seed=1)
    model = init_model(CFG, seed=1)
    apply_lora(model, lora, seed=0)
    randomise_lora_b(model)
    for ad in adapters(model):
        q = getattr(ad.module, ad.name)
        scale = getattr(ad.module, ad.name + "_qscale").get_value()
        w = _get(float_model, ad.path.split("/")).get_value()
        assert q.get_value().dtype == jnp.int8
        err = np.abs(np.asarray(dequantize(q.get_value(), scale)) - np.asarray(w))
        assert (err <= np.asarray(scale) / 2 + 1e-7).all(), ad.path
        _get(float_model, ad.path.split("/")).set_value(dequantize(q.get_value(), scale))
    apply_lora(float_model, LoraConfig(rank=4, alpha=8.0), seed=0)
    for ad, twin in zip(adapters(model), adapters(float_model), strict=True):
        for suffix in ("_lora_a", "_lora_b"):
            getattr(twin.module, twin.name + suffix).set_value(
                ad.a if suffix == "_lora_a" else ad.b
            )
    want = np.asarray(float_model(_ids()))
    # Exact values: the int8 model's ((x W_q) s, W_q s unrounded) and the float model's (its
    # float32 weights round32(W_q s)); they differ by that rounding alone.
    float_lora = dataclasses.replace(lora, quantize_base="none")
    exact_int8 = _exact_forward(model, lora, _ids())
    exact_float = _exact_forward(float_model, float_lora, _ids())
    kw = dict(trusted_exact=exact_float)
    assert_as_accurate(exact_int8, want, exact_float)  # q * s's float32 rounding alone
    # trusted: the dequantised float model; exact: each model's own, in float64
    worst = {"int8": assert_as_accurate(model(_ids()), want, exact_int8, **kw)}
    merged = merge_adapters(model)
    assert all(x.dtype != jnp.int8 for x in jax.tree.leaves(nnx.state(merged)))
    # The merged weights W_q s + (alpha / r) A B compute the int8 model's function, rounded.
    # trusted: the dequantised float model; exact: the int8 model's and its own, in float64
    worst["merged"] = assert_as_accurate(merged(_ids()), want, exact_int8, **kw)
    print("error / bound:", {k: round(float(v), 2) for k, v in worst.items()})


@pytest.mark.slow  # 15 s in a loaded 2-worker run, AMD EPYC AVX2
def test_int8_base_trains_adapters_only():
    graphdef, params, frozen, _ = split_trainable(
        init_model(CFG, seed=1), LoraConfig(rank=4, quantize_base="int8"), seed=0, reference=False
    )
    assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(frozen))
    _, (state, m) = _step(graphdef, params, frozen, 0.1)
    assert np.isfinite(float(m["actor/pg_loss"])) and float(m["actor/skipped"]) == 0
    moved = [float(jnp.abs(x).max()) for x in jax.tree.leaves(split_adapters(state.params)[0])]
    assert max(moved) > 0  # B left zero: the adapters trained on the int8 base


def test_planner_counts_the_int8_base():
    from jaxrl_llm.learner.plan import Workload, plan_memory
    from jaxrl_llm.learner.plan_lora import int8_base_saving
    from jaxrl_llm.learner.plan_shapes import abstract_mesh
    from jaxrl_llm.models.lora import state_bytes

    lora = LoraConfig(rank=4, targets=("q_proj", "gate_proj", "o_proj"))
    int8 = LoraConfig(rank=4, targets=lora.targets, quantize_base="int8")
    frozen = {}
    for cfg in (lora, int8):
        _, _, frozen[cfg], _ = split_trainable(init_model(CFG, seed=1), cfg, seed=0,
                                               reference=False)  # fmt: skip
    saved = state_bytes(frozen[lora]) - state_bytes(frozen[int8])
    assert saved > 0 and int8_base_saving(CFG, abstract_mesh(1, 1, 1), int8) == saved
    plans = [plan_memory(CFG, (1, 1, 1), Workload(2, 16, lora=c)) for c in (lora, int8)]
    assert plans[0].terms["params"] - plans[1].terms["params"] == saved


@pytest.mark.slow  # 19 s in a loaded 2-worker run, AMD EPYC AVX2
def test_int8_base_is_laid_out_like_the_float_weights():
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    model = init_model(CFG, seed=1, mesh=mesh)
    want = np.asarray(model(_ids()))
    apply_lora(model, LoraConfig(rank=4, quantize_base="int8"), seed=0)
    _assert_laid_out_by_logical_axes(model, mesh, ("", "_qscale"))
    # B = 0: the base up to int8 rounding (measured 1.6e-3 on logits of magnitude 0.5).
    np.testing.assert_allclose(model(_ids()), want, rtol=0, atol=5e-3)
