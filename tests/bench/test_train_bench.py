"""`jaxrl-llm bench train` prints one JSON object with finite ratios (not a speed test)."""

import json
import math

from jaxrl_llm import cli
from jaxrl_llm.bench.train import model_flops
from jaxrl_llm.models import ModelConfig


def test_bench_train_json(capsys):
    argv = ["bench", "train", "--checkpoint", "builtin", "--batch", "2", "--seq-len", "16",
            "--repeats", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["train_step"]["loss_finite"]
    for key in ("mfu", "speedup_vs_torch"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    assert out["train_step"]["tokens_per_s"] > 0 and out["torch_fwd_bwd"]["tokens_per_s"] > 0


def test_model_flops_formula():
    cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=2, head_dim=2,
                      tie_word_embeddings=False)  # fmt: skip
    # 6 * (100 params - 40 untied embedding) * 3 tokens + 12 * L2 * N2 * H2 * t^2 9 * B1.
    assert model_flops(cfg, 100, batch=1, seq_len=4) == 6 * 60 * 3 + 12 * 2 * 2 * 2 * 9
