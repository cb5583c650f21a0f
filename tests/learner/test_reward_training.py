"""`jaxrl-llm rm`: the Bradley-Terry loss against float64, a short run that learns held-out
preferences and exports a folder `rm:` scores the same way, a malformed row's one line."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.algorithms.preference import bradley_terry_loss, pair_accuracy
from jaxrl_llm.data.preferences import BadPreferenceRow, check_pair
from jaxrl_llm.learner.optim import OptimConfig
from jaxrl_llm.learner.reward_training import RMConfig, load_pairs, run_rm
from jaxrl_llm.models import init_model
from jaxrl_llm.models.hf_files import read_config, tensor_names
from jaxrl_llm.models.hf_io import save_pretrained
from jaxrl_llm.models.transformer import ValueModel
from jaxrl_llm.testing import FLOAT32_EPS, float32_sum_tolerance, tiny_config

# Per pair, before the sum: the difference d = chosen - rejected, softplus's exp and log1p
# (each within an ulp or so) and the division by P: at most this many roundings of one term.
# The rounding of d itself (|d| eps) goes through the term's derivative in d, the gradient,
# and through the gradient's, a sigmoid's, which exp makes relative to |d|.
TERM_ROUNDINGS = 5
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _tiny_scores(P: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of 2P random rows from a tiny random `ValueModel` with a random head, spread
    out (x20) so some margins are large enough to overflow a naive log(sigmoid)."""
    model = init_model(tiny_config(), seed=0, cls=ValueModel)
    model.score.set_value(jax.random.normal(jax.random.key(1), model.score.shape))
    ids = jax.random.randint(jax.random.key(2), (2 * P, 12), 0, 64)
    scores = 20.0 * np.asarray(model(ids)[:, -1], np.float32)
    return scores[:P], scores[P:]


@pytest.mark.slow  # 9 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_bradley_terry_loss_and_gradient_match_float64():
    P = 64
    chosen, rejected = _tiny_scores(P)
    c64, r64 = chosen.astype(np.float64), rejected.astype(np.float64)
    assert np.abs(c64 - r64).max() > 100  # exp(100) overflows a naive log(1 + exp(-d))
    terms = np.logaddexp(0.0, r64 - c64) / P  # -log sigmoid(c - r) / P, exactly rounded
    want_grad = -1.0 / (1.0 + np.exp(c64 - r64)) / P  # d/dchosen; d/drejected = minus it

    loss, (g_chosen, g_rejected) = jax.value_and_grad(bradley_terry_loss, argnums=(0, 1))(
        jnp.asarray(chosen), jnp.asarray(rejected)
    )
    d_error = np.abs(c64 - r64) * FLOAT32_EPS  # d's rounding, relative to d
    # Each term: its own roundings, and d's propagated by the derivative, |want_grad|.
    term_errors = TERM_ROUNDINGS * FLOAT32_EPS * terms + d_error * np.abs(want_grad)
    tol = float32_sum_tolerance(terms) + term_errors.sum()
    assert abs(float(loss) - terms.sum()) <= tol, (float(loss), terms.sum(), tol)
    # Plus float32's smallest normal: a gradient below it underflows to 0 (a margin > 87).
    grad_tol = (TERM_ROUNDINGS * FLOAT32_EPS + d_error) * np.abs(want_grad) + FLOAT32_TINY
    np.testing.assert_array_less(np.abs(np.asarray(g_chosen, np.float64) - want_grad), grad_tol)
    np.testing.assert_array_less(np.abs(np.asarray(g_rejected, np.float64) + want_grad), grad_tol)
    assert float(pair_accuracy(jnp.asarray(chosen), jnp.asarray(rejected))) == np.mean(c64 > r64)


@pytest.mark.slow  # 7 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_value_model_saves_as_sequence_classifier(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = init_model(tiny_config(), seed=0, cls=ValueModel)
    save_pretrained(model, tmp_path / "rm", head="sequence")
    hf = read_config(tmp_path / "rm")
    assert hf["architectures"] == ["Qwen2ForSequenceClassification"]
    assert hf["num_labels"] == 1
    assert "score.weight" in tensor_names(tmp_path / "rm")
    assert "score.bias" not in tensor_names(tmp_path / "rm")  # HF's RM head has none
    # A random head, so the score is not 0: transformers reads the folder as we do.
    model.score.set_value(jax.random.normal(jax.random.key(1), model.score.shape))
    save_pretrained(model, tmp_path / "rm", head="sequence")
    hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    ids = np.random.default_rng(0).integers(0, 64, (3, 10))
    with torch.no_grad():  # one row at a time: the tiny config has no pad id
        want = np.array([hf_model.eval()(torch.tensor(row[None])).logits[0, 0] for row in ids])
    ours = np.asarray(model(jnp.asarray(ids))[:, -1])
    # The parity bar for a whole model, relative to the largest score.
    assert np.abs(ours - want).max() <= 1e-4 * np.abs(want).max(), (ours, want)
    model.score_bias.set_value(jnp.ones_like(model.score_bias[...]))
    with pytest.raises(ValueError, match="has no bias"):
        save_pretrained(model, tmp_path / "biased", head="sequence")


def test_shipped_config_parses_and_validates():
    from jaxrl_llm.config import CONFIGS_DIR, parse_gin

    assert (CONFIGS_DIR / "rm_tiny.gin").read_text().startswith("# jaxrl-llm rm")
    parse_gin(["rm_tiny.gin"], [])
    try:
        cfg = RMConfig()
    finally:
        gin.clear_config()  # the bindings would reach later tests' configs
    cfg.validate()
    assert cfg.out_dir == "runs/rm_tiny" and cfg.optim.lr == 3e-4


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "q", "chosen": "a"}, "row 2: no 'rejected' string"),
        ({"chosen": "a", "rejected": "b"}, "row 2: no 'prompt' or 'messages'"),
        ({"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}, "row 2: the prompt"),
        (["not", "an", "object"], "row 2: expected a JSON object"),
    ],
)
def test_malformed_row_is_one_line_naming_it(tmp_path, capsys, row, message):
    good = {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}
    assert check_pair(good, "x") == good
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(BadPreferenceRow, match=f"pairs.jsonl: {message}"):
        load_pairs(RMConfig(train_file=str(path), n_val=1))
    # The command: exit status 2 and one line, before any model loads.
    params = [f'RMConfig.train_file = "{path}"', f'RMConfig.out_dir = "{tmp_path / "out"}"']
    argv = ["rm"] + [a for p in params for a in ("--gin_param", p)]
    try:
        assert cli.main(argv) == 2
    finally:
        gin.clear_config()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.slow  # measured: 50 steps of 32 pairs and the export, 142 s on 2 loaded cores
def test_short_run_learns_held_out_preferences_and_rm_scores_them(tmp_path):
    from jaxrl_llm.rewards.model import RewardModel

    cfg = RMConfig(
        out_dir=str(tmp_path / "rm"), n_train=1024, n_val=128, levels=(1, 2), steps=50,
        batch_size=32, seq_len=144, eval_every=50,
        optim=OptimConfig(lr=3e-4, warmup_steps=5, decay="cosine"),
    )  # fmt: skip
    history = run_rm(cfg)
    # 128 pairs: chance is 0.5 with a standard deviation of 0.044. The bar, 80 of 128
    # (0.625), is 2.8 of them above it (p < 0.003 by chance alone) and leaves room for the
    # run's noise on another host's float32 (measured here: 0.766 at step 50; 0.64 / 0.56 /
    # 0.72 / 0.77 at steps 10-40).
    assert history["val/accuracy"] >= 0.625, history
    assert history["val/loss"] < np.log(2.0), history

    _, val = load_pairs(cfg)
    with RewardModel(tmp_path / "rm" / "hf") as rm:  # what `rm:<folder>` loads
        chosen = rm.score([p["chosen"] for p in val], val)
        rejected = rm.score([p["rejected"] for p in val], val)
    accuracy = float(np.mean(chosen > rejected))
    assert accuracy >= 0.625, accuracy
    # The same rows scored the same way: at most a near-tie flips under other padding.
    assert abs(accuracy - history["val/accuracy"]) <= 2 / len(val)


@pytest.mark.parametrize(
    ("held_out", "train", "seq_len", "which"),
    [
        ("a", "b", 4, "training pairs"),  # nothing fits 4 tokens: the prompt alone is longer
        ("x" * 400, "b", 128, "held-out pairs"),  # the training pair fits, the held-out not
    ],
)
def test_pairs_that_fit_no_row_are_one_line_before_config_gin(
    tmp_path, capsys, held_out, train, seq_len, which
):
    path, out = tmp_path / "pairs.jsonl", tmp_path / "out"
    rows = [{"prompt": "q", "chosen": r, "rejected": r} for r in (held_out, train)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = [f'RMConfig.train_file = "{path}"', f'RMConfig.out_dir = "{out}"',
              "RMConfig.n_val = 1", f"RMConfig.seq_len = {seq_len}"]  # fmt: skip
    assert cli.main(["rm", *[a for p in params for a in ("--gin_param", p)]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxrl-llm rm: configuration error: "), err
    assert f"none of the 1 {which} fits in RMConfig.seq_len = {seq_len}" in err[0], err
    assert "raise RMConfig.seq_len to" in err[0]
    assert not out.exists()  # no config.gin written for a run that cannot start
