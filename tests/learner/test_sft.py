"""SFT: environment text is masked, accumulation equals the full batch, loss goes down."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.learner.optim import OptimConfig, learning_rate_schedule
from jaxrl_llm.learner.sft import SFTConfig, encode_example, make_train_step, pack, run_sft
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.models import ModelConfig, init_model, load_tokenizer
from jaxrl_llm.testing import assert_as_accurate, float64_twin


def test_tool_output_is_masked_and_stop_string_trained():
    tok = load_tokenizer(builtin_checkpoint())
    ex = {
        "system": "You can run Python.",
        "prompt": "What is 2 * 3?",
        "response": "```python\nprint(2 * 3)\n```\n```output\n6\n```\nThe answer is \\boxed{6}.",
    }
    ids, mask = encode_example(ex, tok)
    trained = "".join(tok.decode([i]) for i, m in zip(ids, mask) if m)
    assert trained == (
        "```python\nprint(2 * 3)\n```\n```output" + "The answer is \\boxed{6}." + "<|im_end|>"
    )
    assert tok.decode(ids).endswith(ex["response"] + "<|im_end|>")
    assert "What is" not in trained  # prompt not trained


def test_learning_rate_schedule_warmup_then_cosine():
    sched = learning_rate_schedule(OptimConfig(lr=1.0, warmup_steps=10, decay="cosine"), 110)
    assert float(sched(0)) == 0.0
    np.testing.assert_allclose(float(sched(5)), 0.5, rtol=1e-6)
    np.testing.assert_allclose(float(sched(10)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(sched(60)), 0.5, rtol=1e-5)  # half-way down the cosine
    np.testing.assert_allclose(float(sched(110)), 0.0, atol=1e-6)


@pytest.mark.slow  # 22 s in a loaded 2-worker run, AMD EPYC AVX2
def test_micro_batch_accumulation_equals_full_batch():
    cfg = ModelConfig(vocab_size=32, num_layers=1)
    model = init_model(cfg, seed=0)
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 32, (4, 10)).astype(np.int32)
    mask = (rng.random((4, 10)) < 0.7).astype(np.float32)  # uneven tokens per row
    tx = optax.sgd(1.0)  # the update is the gradient itself: Adam would amplify rounding
    step = make_train_step(graphdef, tx)

    def run(M, step=step, params=params, dtype=np.float32):
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.key(0))
        batch = {
            "ids": jnp.asarray(ids.reshape(M, -1, 10)),
            "mask": jnp.asarray(mask.reshape(M, -1, 10).astype(dtype)),
        }
        return step(state, batch)

    s1, m1 = run(1)
    s4, m4 = run(4)
    with jax.enable_x64(True):  # the same step on the whole batch, in float64
        graphdef64, params64 = nnx.split(float64_twin(model))
        s64, m64 = jax.device_get(run(1, make_train_step(graphdef64, tx), params64, np.float64))
    # got: 4 micro-batches; trusted: the whole batch (float32); exact: the whole batch (float64).
    pick = lambda s, m: (s.params, m["loss"], m["grad_norm"])
    worst = assert_as_accurate(pick(s4, m4), pick(s1, m1), pick(s64, m64))
    print(f"error / bound: {worst:.2f}")


@pytest.mark.slow  # measured: an SFT run, 12 s on 2 cores (docs/testing.md)
def test_sft_reduces_validation_loss(tmp_path):
    from jaxrl_llm.assets.build import build

    init = build(tmp_path / "init")  # the seeded random init (the shipped one is trained)
    cfg = SFTConfig(
        checkpoint=str(init),
        out_dir=str(tmp_path / "sft"), n_train=64, n_val=16, levels=(1,), steps=30,
        batch_size=8, seq_len=160, eval_every=30,
        optim=OptimConfig(lr=3e-3, warmup_steps=5),
    )  # fmt: skip
    tok = load_tokenizer(builtin_checkpoint())
    ids, _ = pack([{"prompt": "hi", "response": "x"}], tok, 160)
    assert ids.shape == (1, 160)
    first = run_sft(cfg.__class__(**{**cfg.__dict__, "steps": 1, "eval_every": 1}))
    last = run_sft(cfg)
    assert last["val/loss"] < first["val/loss"] - 0.5
    assert (tmp_path / "sft" / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "sft" / "hf" / "tokenizer.json").is_file()


@pytest.mark.slow  # measured: 14.2 s (fast tier, AMD EPYC, 2026-12-06)
def test_no_validation_and_last_step_only_validation_run(tmp_path):
    """`n_val = 0` trains without validation and `eval_every = 0` validates at the last step
    only (both passed the config check and then crashed: a modulo by zero, an empty pack)."""
    import json

    base = dict(out_dir=str(tmp_path / "sft"), n_train=16, levels=(1,), steps=2, batch_size=4,
                seq_len=160)  # fmt: skip
    got = run_sft(SFTConfig(**base, n_val=0, eval_every=1))
    assert "val/loss" not in got and got["step"] == 2
    run_sft(SFTConfig(**base, n_val=4, eval_every=0))
    lines = (tmp_path / "sft" / "sft_metrics.jsonl").read_text().splitlines()
    assert ["val/loss" in json.loads(x) for x in lines] == [False, True]


def test_a_train_file_no_longer_than_n_val_is_refused(tmp_path):
    from jaxrl_llm.config_checks import ConfigError

    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1+1", "response": "2"}\n' * 3)
    cfg = SFTConfig(out_dir=str(tmp_path / "sft"), train_file=str(data), n_val=3, steps=1)
    with pytest.raises(ConfigError, match=r"has 3 rows; it needs more than SFTConfig.n_val = 3"):
        run_sft(cfg)
