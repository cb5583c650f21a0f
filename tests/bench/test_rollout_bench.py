"""`jaxrl-llm bench rollout` prints one JSON object whose rates, ratios and sizes agree."""

import json

import jax
import pytest
from flax import nnx

from jaxrl_llm import cli
from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.models import from_pretrained


@pytest.mark.slow  # measured: a benchmark with HF generate, 4 s on 2 cores (docs/testing.md)
def test_bench_rollout_json(capsys):
    B, P, N = 2, 8, 4
    argv = ["bench", "rollout", "--checkpoint", "builtin", "--batch", str(B), "--prompt-len",
            str(P), "--new-tokens", str(N), "--steps-per-call", "4", "--repeats", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    shape = (out["suite"], out["batch"], out["prompt_len"], out["new_tokens"])
    assert shape == ("rollout", B, P, N)
    eng, hf, ceil = out["engine"], out["hf_generate"], out["ceilings"]
    # Sizes: counted here independently from the shipped checkpoint (float32 weights).
    model = from_pretrained(resolve_checkpoint("builtin"))
    leaves = jax.tree.leaves(nnx.state(model))
    assert eng["params"] == sum(x.size for x in leaves)
    assert eng["param_bytes"] == 4 * eng["params"]
    # Rates are tokens over the seconds reported next to them.
    assert eng["prefill_s"] > 0 and eng["decode_s"] > 0 and hf["total_s"] > 0
    assert eng["prefill_tokens_per_s"] == pytest.approx(B * P / eng["prefill_s"])
    assert eng["decode_tokens_per_s"] == pytest.approx(B * N / eng["decode_s"])
    assert eng["tokens_per_s"] == pytest.approx(B * N / (eng["prefill_s"] + eng["decode_s"]))
    # The shipped model's embedding is tied: read whole as the LM head, its B rows besides.
    D = model.config.hidden_size
    assert eng["decode_weight_bytes_per_step"] == eng["param_bytes"] + B * D * 4
    weight_reads = eng["decode_weight_bytes_per_step"] * N / eng["decode_s"]
    assert eng["decode_weight_bytes_per_s"] == pytest.approx(weight_reads)
    assert hf["tokens_per_s"] == pytest.approx(B * N / hf["total_s"])
    # Ratios are the quotients of the numbers they compare.
    assert out["speedup_vs_hf"] == pytest.approx(eng["tokens_per_s"] / hf["tokens_per_s"])
    assert out["decode_bandwidth_roofline_fraction"] == pytest.approx(
        eng["decode_weight_bytes_per_s"] / ceil["read_bytes_per_s"]
    )
    # Ceilings of a real CPU: at least 0.1 GFLOP/s and 0.1 GB/s.
    assert ceil["matmul_flops"] > 1e8 and ceil["read_bytes_per_s"] > 1e8


@pytest.mark.slow  # measured: 10.6 s alone on 2 cores (AMD EPYC, 2026-12-04)
def test_bench_rollout_profile_counts_the_ops_of_a_decode_step(capsys):
    """`--profile`: one traced decode call, its op time joined to the model's source, and
    the ops run per decode step: a decode step of the shipped 2-layer model runs each
    layer's projections, so at least 2 x 4 matmul ops (q/k/v may fuse; o, gate/up, down)."""
    argv = ["bench", "rollout", "--checkpoint", "builtin", "--batch", "2", "--prompt-len", "8",
            "--new-tokens", "4", "--steps-per-call", "4", "--repeats", "1", "--skip-hf",
            "--profile"]  # fmt: skip
    assert cli.main(argv) == 0
    prof = json.loads(capsys.readouterr().out)["engine"]["profile"]
    assert prof["total_ms"] > 0 and prof["by_kind"]["matmul"]["ms"] > 0
    assert prof["ops_per_step"] == pytest.approx(prof["op_events"] / 4)
    assert prof["ops_per_step"] >= 8
    functions = {f["function"] for f in prof["by_function"] if f["kind"] == "matmul"}
    assert any(f.startswith("jaxrl_llm/models/") for f in functions), functions


@pytest.mark.slow  # measured: 8 samples x 2,048 decode steps twice, about 20 s on 2 cores
def test_bench_rollout_mixed_reads_only_what_is_in_context(capsys):
    assert cli.main(["bench", "rollout", "--mixed", "--prompts", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    eng = out["engine"]
    assert out["suite"] == "rollout-mixed" and eng["samples"] == 8
    assert eng["kv_read_over_in_context"] == pytest.approx(
        eng["kv_bytes_read_per_token"] / eng["kv_bytes_in_context_per_token"]
    )
    # The paged walk reads within 1.3x of what is in context; a dense cache, far more.
    assert 1.0 <= eng["kv_read_over_in_context"] <= 1.3
    assert eng["dense_cache_read_over_in_context"] > 1.5
    assert eng["peak_kv_bytes"] <= eng["kv_pool_bytes"]


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_a_decode_step_reads_an_untied_embedding_only_at_its_rows(tied, int8):
    """Bytes one decode step reads: every weight once, except an untied input embedding
    [V, D], of which the step gathers only B rows (a tied one is also the LM head, read
    whole, and its B rows besides). Int8: a row is D bytes and its float32 scale."""
    from jaxrl_llm.bench.rollout import decode_weight_bytes_per_step
    from jaxrl_llm.models import CausalLM, ModelConfig
    from jaxrl_llm.models.quant import int8_projections

    V, D, B = 512, 32, 3
    cfg = ModelConfig(vocab_size=V, hidden_size=D, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16,
                      tie_word_embeddings=tied)  # fmt: skip
    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    if int8:
        int8_projections(model)
    stored = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    row = D + 4 if int8 else 4 * D
    expected = stored - (0 if tied else V * row) + B * row
    assert decode_weight_bytes_per_step(model, B) == expected
