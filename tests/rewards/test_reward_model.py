"""Reward models from HF `*ForSequenceClassification` folders (`rewards/model.py`): scores
equal `transformers`' on tiny random checkpoints, sharded equals unsharded, the `rm:` name
in `RewardConfig`, and the checks that refuse a folder that is not a reward model."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.packing import first_fit_rows
from jaxrl_llm.models.hf_io import CheckpointError
from jaxrl_llm.rewards.combined import ModelAndRuleRewards
from jaxrl_llm.rewards.config import (
    RewardConfig,
    build_reward_pool,
    build_rewards,
    check_rewards,
)
from jaxrl_llm.rewards.model import (
    RewardModel,
    bucket,
    conversation,
    conversation_tokens,
    normalize_scores,
    score_index,
)
from jaxrl_llm.rewards.model_config import WHITEN_EPS, RewardModelConfig
from jaxrl_llm.testing import FLOAT32_EPS, write_reference_checkpoint, write_reward_model

# Rows of different lengths (1 to ~120 tokens): a string prompt, chat messages with a system
# turn, and a response ending in the pad id (HF reads the token before it).
ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5"},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Name a colour."}], "prompt": "Name a colour."},
    {"prompt": "Tell me about the sea. " * 3, "answer": "wet"},
    {"prompt": "x", "answer": "y"},
    {"prompt": "Count to five.", "answer": "1 2 3 4 5"},
    {"prompt": "Say nothing.", "answer": ""},
]  # fmt: skip
RESPONSES = [
    r"It is \boxed{5}.",
    "Blue, or perhaps green and red, depending on the light. " * 2,
    "Salty.",
    "ok<|endoftext|>",
    "1 2 3 4 5",
    "",
]
# (model_type, the tokenizer has a chat template): Llama without one is scored on the
# plain concatenation, its "<|endoftext|>" then the row's last token.
FAMILIES = {"qwen2": ("qwen2", True), "llama": ("llama", False), "qwen3": ("qwen3", True)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def reward_folder(request, tmp_path_factory):
    model_type, template = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(f"rm_{request.param}")
    torch_model = write_reward_model(path, model_type, seed=1, chat_template=template)
    return request.param, path, torch_model


def _hf_tokens(tokenizer, row, response):
    """The tokens HF users feed an RM: `apply_chat_template(..., tokenize=True)`, or the plain
    text with the tokenizer's special tokens when it has no template."""
    chat = conversation(row, response)
    if tokenizer.chat_template:
        return list(tokenizer.apply_chat_template(chat, tokenize=True)["input_ids"])
    return tokenizer("\n".join(m["content"] for m in chat[:-1]) + response)["input_ids"]


def _hf_scores(torch_model, rows: list[list[int]], pad: int, dtype) -> np.ndarray:
    """HF's own forward on one right-padded batch: it finds each row's last non-pad token."""
    ids = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    model = torch_model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    torch_model.float()
    return out[:, 0].double().numpy()


def test_scores_match_transformers(reward_folder):
    """Relative error <= 1e-4 against HF float32 (the issue's bar), and the float32 error
    against HF's float64 run within 4x HF float32's own (floored at 8 roundings of the
    largest score: a lucky HF run must not make the bound vanish)."""
    name, path, torch_model = reward_folder
    rm = RewardModel(path, RewardModelConfig(batch_size=1))  # a forward per packed row
    ours = rm.score(RESPONSES, ROWS)
    tokens = [_hf_tokens(rm.tokenizer, e, r) for e, r in zip(ROWS, RESPONSES, strict=True)]
    lengths = [len(t) for t in tokens]  # packed: rows shared, so segments are exercised
    assert 1 < len(first_fit_rows(lengths, bucket(max(lengths), 16))) < len(ROWS)
    hf32 = _hf_scores(torch_model, tokens, 0, torch.float32)
    hf64 = _hf_scores(torch_model, tokens, 0, torch.float64)
    scale = np.abs(hf64).max()
    rel = np.abs(ours - hf32).max() / scale
    ours_err, hf_err = np.abs(ours - hf64).max(), np.abs(hf32 - hf64).max()
    print(f"{name}: rel err vs HF f32 {rel:.2e}; |ours - f64| {ours_err:.2e}, "
          f"|HF f32 - f64| {hf_err:.2e}, max |score| {scale:.2f}")  # fmt: skip
    assert ours.dtype == np.float32 and ours.shape == (len(ROWS),)
    assert rel <= 1e-4
    assert ours_err <= 4 * max(hf_err, 8 * FLOAT32_EPS * scale)


def test_tokens_are_the_chat_template_s_and_the_score_is_read_where_hf_reads_it(reward_folder):
    _, path, _ = reward_folder
    rm = RewardModel(path)
    chats = [conversation(e, r) for e, r in zip(ROWS, RESPONSES, strict=True)]
    expected = [_hf_tokens(rm.tokenizer, e, r) for e, r in zip(ROWS, RESPONSES, strict=True)]
    assert conversation_tokens(rm.tokenizer, chats) == expected
    assert score_index([5, 6, 0, 0], 0) == 1  # trailing pad ids skipped, as HF's argmax rule
    assert score_index([5, 0, 6], 0) == 2
    assert score_index([0, 0], 0) == 0
    assert score_index([5, 0], None) == 1


def test_sharded_load_scores_like_unsharded(tmp_path):
    """On 8 simulated devices (data 2 x fsdp 2 x tensor 2): weights split over fsdp and
    tensor, rows over data x fsdp; the scores agree to float32 rounding of a whole model."""
    from jaxrl_llm.sharding.mesh import build_mesh

    write_reward_model(tmp_path, "qwen2", seed=2)
    plain = RewardModel(tmp_path).score(RESPONSES, ROWS)
    mesh = build_mesh(data=2, fsdp=2, tensor=2)
    sharded_rm = RewardModel(tmp_path, mesh=mesh)
    leaf = sharded_rm._state["model"]["layers"][0]["mlp"]["gate_proj"][...]
    assert len(leaf.sharding.device_set) == 8 and not leaf.sharding.is_fully_replicated
    sharded = sharded_rm.score(RESPONSES, ROWS)
    diff = np.abs(sharded - plain).max() / np.abs(plain).max()
    print(f"sharded vs unsharded: max rel diff {diff:.2e}")
    assert diff <= 1e-5


def test_normalisations():
    s = np.array([1.0, 2.0, 3.0, 6.0], np.float32)
    np.testing.assert_array_equal(normalize_scores(s, "raw"), s)
    # Computed in float64 and rounded once to float32: exactly the formulas' float32 value.
    x = s.astype(np.float64)
    whitened = (x - x.mean()) / (x.std() + WHITEN_EPS)
    np.testing.assert_array_equal(normalize_scores(s, "whiten"), whitened.astype(np.float32))
    sigmoid = 1 / (1 + np.exp(-x))
    np.testing.assert_array_equal(normalize_scores(s, "sigmoid"), sigmoid.astype(np.float32))
    assert normalize_scores(np.array([4.0]), "whiten").tolist() == [0.0]
    assert [bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]
    assert bucket(3, 16) == 16


def test_rm_name_in_reward_config_resolves_to_the_model(tmp_path):
    """`RewardConfig.name = "rm:<folder>"` and in `weights` beside a rule reward, with its
    own options: the pool-like object the RL stage scores with."""
    write_reward_model(tmp_path, "qwen2", seed=3)
    raw = RewardModel(tmp_path).score(RESPONSES, ROWS)
    with build_rewards(RewardConfig(name=f"rm:{tmp_path}")) as alone:
        assert isinstance(alone, ModelAndRuleRewards) and alone.pool is None
        np.testing.assert_array_equal(alone.score(RESPONSES, ROWS), raw)
        assert alone.last_failures == {}
    # Without a rule pool the failure score and the stop rule are still the config's.
    cfg = RewardConfig(name=f"rm:{tmp_path}", incorrect=-1.0, max_error_frac=0.25)
    with build_rewards(cfg) as alone:
        assert (alone.incorrect, alone.max_error_frac) == (-1.0, 0.25)
    weights = {"math": 1.0, f"rm:{tmp_path}": (0.5, {"normalize": "sigmoid"})}
    with build_rewards(RewardConfig(weights=weights, workers=1)) as mixed:
        got = mixed.score(RESPONSES, ROWS)
        assert list(mixed.last_failures) == [1]  # row 1 has no 'answer': math raises
    math = np.array([1, 0, 0, 0, 0, 0], np.float32)  # only the first response boxes the answer
    # The documented sum in float32 (`ModelAndRuleRewards`: the rules, then + weight * the
    # model's score normalised by `normalize_scores`, itself checked against the float64
    # sigmoid rounded once): equal, not close.
    expected = np.zeros(len(RESPONSES), np.float32) + math
    expected += np.float32(0.5) * normalize_scores(raw, "sigmoid")
    expected[1] = RewardConfig().incorrect  # a failed sample: `incorrect`, no model part
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ConfigError, match=r"reward model.*rule rewards only.*jaxrl-llm train"):
        build_reward_pool(RewardConfig(weights=weights))  # rule rewards only (eval's)


def test_a_folder_that_is_not_a_reward_model_is_refused(tmp_path):
    policy = tmp_path / "policy"
    write_reference_checkpoint(policy, "qwen2", vocab_size=259)
    shutil.copy(builtin_checkpoint() / "tokenizer.json", policy)
    with pytest.raises(CheckpointError, match=r"Qwen2ForCausalLM.*not a reward model"):
        check_rewards(RewardConfig(name=f"rm:{policy}"))
    two = tmp_path / "two_labels"
    write_reward_model(two, "qwen2")
    config = json.loads((two / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="2 labels"):
        check_rewards(RewardConfig(weights={f"rm:{two}": 1.0}))
    with pytest.raises(CheckpointError, match="no such folder"):
        check_rewards(RewardConfig(name=f"rm:{tmp_path / 'missing'}"))


def test_config_validation_of_rm_names():
    RewardConfig(name="rm:/some/folder")  # accepted: the folder is checked when built
    RewardConfig(weights={"math": 1.0, "rm:/a": (0.2, {"normalize": "whiten"})})
    with pytest.raises(ConfigError, match="give the folder after 'rm:'"):
        RewardConfig(name="rm:")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['temperature'\]"):
        RewardConfig(weights={"rm:/a": (1.0, {"temperature": 0.5})})
    with pytest.raises(ValueError, match="normalize"):
        RewardConfig(weights={"rm:/a": (1.0, {"normalize": "softmax"})})


def test_bfloat16_scores_close_to_float32(tmp_path):
    """The accelerator setting on CPU: bfloat16 weights and compute, float32 scores. bf16
    keeps ~3 significant digits (8-bit mantissa, eps 2**-8) through each of the trunk's
    roundings; 0.1 of the largest score is the bar tests/models/test_parity.py sets for
    bfloat16 logits of the same order."""
    write_reward_model(tmp_path, "qwen2", seed=5)
    f32 = RewardModel(tmp_path).score(RESPONSES, ROWS)
    bf16_rm = RewardModel(tmp_path, RewardModelConfig(dtype="bfloat16"))
    assert bf16_rm._state["score"][...].dtype == jnp.bfloat16
    bf16 = bf16_rm.score(RESPONSES, ROWS)
    diff = np.abs(bf16 - f32).max() / np.abs(f32).max()
    print(f"bfloat16 vs float32: max rel diff {diff:.2e}")
    assert bf16.dtype == np.float32 and diff < 0.1
