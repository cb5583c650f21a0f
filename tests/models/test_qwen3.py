"""Qwen3 dense: q/k RMSNorm per head before RoPE, no q/k/v bias, head_dim != D / N.

Parity with `transformers`' Qwen3ForCausalLM on a tiny random checkpoint, the save/load round
trip, the paged rollout engine against full recomputation and HF greedy generation, and the
norm weights' sharding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from jaxrl_llm.models import CausalLM, ModelConfig, from_pretrained, save_pretrained
from jaxrl_llm.sharding import SAMPLE_RULES, TRAIN_RULES, build_mesh, state_specs
from jaxrl_llm.testing import assert_as_accurate, write_reference_checkpoint
from tests.models.test_parity import _torch_logits

TOL = 1e-4  # float32, whole model
# head_dim 24 with D = 64, N = 4 (64 / 4 = 16): Qwen3 decouples the two, as Qwen3-0.6B does
# (D = 1024, N = 16, H = 128).
QWEN3 = dict(head_dim=24, rope_theta=1e6, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """(path, torch model) of a tiny random Qwen3 checkpoint."""
    path = tmp_path_factory.mktemp("qwen3")
    return path, write_reference_checkpoint(path, "qwen3", seed=11, **QWEN3)


def _batch(vocab, seed):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, vocab, size=(3, 20))
    mask = np.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :11] = 0
    return ids, mask, np.maximum(np.cumsum(mask, -1) - 1, 0)


def test_config_reads_qwen3_fields(qwen3):
    model = from_pretrained(qwen3[0])
    cfg = model.config
    assert (cfg.model_type, cfg.qk_norm, cfg.qkv_bias, cfg.head_dim) == ("qwen3", True, False, 24)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (24,) and attn.k_norm.weight.shape == (24,)
    assert not hasattr(attn, "q_bias")


@pytest.mark.slow  # 19 s in a loaded 2-worker run, AMD EPYC AVX2
def test_logits_match_transformers_with_left_padding(qwen3):
    path, torch_model = qwen3
    model = from_pretrained(path)
    ids, mask, positions = _batch(model.config.vocab_size, seed=0)
    ref = _torch_logits(torch_model, ids, mask, positions)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    real = mask.astype(bool)  # padded query rows are meaningless in both
    np.testing.assert_allclose(ours[real], ref[real], atol=TOL, rtol=0)
    # The norms matter: without them the logits are far off (so the check above can fail).
    plain = from_pretrained(path)
    for layer in plain.model.layers:
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight[...] = jnp.ones_like(norm.weight[...])
    off = np.asarray(plain(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert np.abs(off - ref)[real].max() > 100 * TOL


@pytest.mark.slow  # 6 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_save_pretrained_roundtrip_through_transformers(qwen3, tmp_path):
    path, torch_model = qwen3
    model = from_pretrained(path)
    save_pretrained(model, tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded).__name__ == "Qwen3ForCausalLM"
    # The weights round-trip bit for bit, so both logits are one torch program on the same
    # inputs: equal exactly.
    want, got = torch_model.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    ids, mask, positions = _batch(model.config.vocab_size, seed=1)
    np.testing.assert_array_equal(
        _torch_logits(reloaded, ids, mask, positions),
        _torch_logits(torch_model, ids, mask, positions),
    )
    again = from_pretrained(tmp_path / "out")
    assert again.config == model.config
    np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids))), model(jnp.asarray(ids)))


@pytest.mark.slow  # 33 s in a loaded 2-worker run, AMD EPYC AVX2
def test_paged_engine_greedy_equals_transformers_generate(qwen3):
    """The rollout engine (paged KV cache, prefill + decode through `extend_paged`) greedy
    tokens equal HF's `generate`, and its logprobs equal a full uncached forward's."""
    from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams
    from tests.rollout.reference import exact_logprobs, full_logits

    path, torch_model = qwen3
    model = from_pretrained(path)
    engine = Engine(model, max_concurrent_decodes=2, max_cache_length=40,
                    max_prefill_length=16, page_size=4, eos_ids=())  # fmt: skip
    prompts = [[3, 4, 7], [9, 1, 2, 8, 50, 60], [11, 12, 13, 14, 15]]
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, raw_logprobs=True)
    outs = RolloutDriver(engine, steps_per_call=3).generate(prompts, sp)
    picked = []
    for prompt, c in zip(prompts, outs, strict=True):
        with torch.no_grad():
            hf = torch_model.generate(
                torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                pad_token_id=0,
            )  # fmt: skip
        np.testing.assert_array_equal(c.token_ids, hf[0, len(prompt) :].numpy())
        seq = list(prompt) + list(c.token_ids)
        rows = [seq[: len(prompt) + t] for t in range(len(c.token_ids))]
        logp = np.asarray(jax.nn.log_softmax(full_logits(model, rows)))
        picked.append(np.take_along_axis(logp, np.asarray(c.token_ids)[:, None], 1)[:, 0])
    got = np.concatenate([c.raw_logprobs for c in outs])
    # trusted: the full uncached forward's log-softmax; exact: the same in float64
    worst = assert_as_accurate(got, np.concatenate(picked), exact_logprobs(model, outs))
    print(f"engine logprobs error / bound = {worst:.2f}")


def test_qk_norm_weights_are_sharded_by_head_dim_rule():
    """The norm weights carry the `head_dim` logical axis (replicated under both tables, as
    the projections' head_dim is); every other parameter's spec equals Qwen2's."""
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    shapes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=16)  # fmt: skip
    specs = {}
    for family, extra in (("qwen2", {}), ("qwen3", dict(qk_norm=True, qkv_bias=False))):
        cfg = ModelConfig(model_type=family, **shapes, **extra)
        state = nnx.state(nnx.eval_shape(lambda cfg=cfg: CausalLM(cfg, rngs=nnx.Rngs(0))))
        assert all(
            var.get_metadata()["logical_axes"] == ("head_dim",)
            for path, var in nnx.to_flat_state(state)
            if "q_norm" in path or "k_norm" in path
        )
        specs[family] = {r: state_specs(state, mesh, rules) for r, rules in
                         (("train", TRAIN_RULES), ("sample", SAMPLE_RULES))}  # fmt: skip
    for table in ("train", "sample"):
        q3, q2 = specs["qwen3"][table], specs["qwen2"][table]
        norms = {k: v for k, v in q3.items() if k.endswith(("q_norm/weight", "k_norm/weight"))}
        assert len(norms) == 4 and all(v == [] for v in norms.values())
        biases = {k: v for k, v in q2.items() if k.endswith("_bias")}
        assert {k: v for k, v in q3.items() if k not in norms} == {
            k: v for k, v in q2.items() if k not in biases
        }


def test_unsupported_qwen3_options_are_refused():
    from jaxrl_llm.models import UnsupportedModelError

    hf = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
              num_hidden_layers=1, num_attention_heads=4, head_dim=8)  # fmt: skip
    assert ModelConfig.from_hf(hf).qk_norm
    with pytest.raises(UnsupportedModelError, match="use_sliding_window"):
        ModelConfig.from_hf({**hf, "use_sliding_window": True})


@pytest.mark.slow  # 18 s in a loaded 2-worker run, AMD EPYC AVX2
def test_qwen3_presets_match_published_parameter_counts():
    """Qwen3-0.6B: 0.60 B parameters (0.44 B without the tied embedding); Qwen3-8B: 8.19 B
    (6.95 B without embeddings), as the model cards state."""
    from jaxrl_llm.learner.plan_shapes import abstract_mesh, model_config, param_bytes

    one = abstract_mesh(1, 1, 1)
    small = param_bytes(model_config("qwen3-0.6b"), one, TRAIN_RULES)[1]
    large = param_bytes(model_config("qwen3-8b"), one, TRAIN_RULES)[1]
    assert small == pytest.approx(0.596e9, rel=0.01)
    assert small - 151936 * 1024 == pytest.approx(0.44e9, rel=0.01)
    assert large == pytest.approx(8.19e9, rel=0.01)
    assert large - 2 * 151936 * 4096 == pytest.approx(6.95e9, rel=0.01)
