"""A user environment with two tools, by import path, through a whole RL run (`run_rl`):
prompts rendered with its tools, episodes scored by it, its metrics logged, every
environment closed; the built-in `arithmetic` environment the same way on validation.

The policy is scripted (`ScriptedEngine`: a turn of two tool calls, then an answer) so the
tools run in every episode: the tiny model never writes a call of its own."""

import json
from pathlib import Path

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.testing import register_test_rewards
from tests.learner.rl_helpers import TINY_RL_PARAMS
from tests.rollout.scripted import script_the_engine

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# Per environment: (its tools, the rows of its data files, the scripted turns). The last turn
# answers right in even slots and wrong in odd ones, so a group's episodes score 1 and 0:
# nonzero advantages, an update that moves the policy.
CASES = {
    "env_example:make_env": (
        ("lookup", "count_letters"),
        [{"prompt": "What is the capital of France?", "answer": "Paris"},
         {"prompt": "Which city is the capital of France?", "answer": "Paris"}],
        [_call("lookup", country="France") + "\n" + _call("count_letters", word="Paris")
         + "<|im_end|>", ("The capital of France is Paris.<|im_end|>",
                          "The capital of France is Lyon.<|im_end|>")],
    ),
    "arithmetic": (
        ("add", "divide"),
        [{"prompt": "What is 36 plus 6, divided by 6?", "answer": "7"},
         {"prompt": "Add 6 to 36, then divide by 6.", "answer": "7"}],
        [_call("add", a=36, b=6) + "\n" + _call("divide", a=42, b=6) + "<|im_end|>",
         ("The answer is \\boxed{7}.<|im_end|>", "The answer is \\boxed{8}.<|im_end|>")],
    ),
}  # fmt: skip


@pytest.mark.parametrize("env", list(CASES))
def test_an_environment_runs_the_loop(tmp_path, monkeypatch, env):
    monkeypatch.syspath_prepend(str(HERE))  # as PYTHONPATH=. does for a user's module
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS (unused: env rewards)
    tools, rows, turns = CASES[env]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script_the_engine(monkeypatch, turns)
    params = [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path}'", "RLConfig.save_every = 0",
              "RLConfig.steps = 2", "RLConfig.eval_every = 2", f"DataConfig.train_file = '{data}'",
              f"DataConfig.val_file = '{data}'", "DataConfig.max_prompt_length = 224",
              "RolloutConfig.max_new_tokens = 256", f"RolloutConfig.env = '{env}'",
              "EpisodeConfig.reward_rule = 'sum'"]  # fmt: skip
    parse_gin([], params)
    records = run_rl(RLConfig())
    assert [r["step"] for r in records] == [0, 1, 2]
    last = records[-1]
    for name in tools:
        assert f"tools/{name}/calls" in last and f"val/tools/{name}/calls" in last
    for key in ("env/turns/mean", "env/well_formed_share", "env/reward/mean"):
        assert key in last and f"val/{key}" in records[0]
    assert last["env/turns/mean"] >= 1
    assert 0 <= last["val/test_score"] <= 1
    # The script's turns ran: both tools called once per episode, their answers observed,
    # then a right answer, in training and in validation alike.
    for prefix, record in (("", last), ("val/", records[0])):
        for name in tools:
            calls = record[f"{prefix}tools/{name}/calls"]
            assert calls > 0 and record[f"{prefix}tools/{name}/ran"] == calls, (name, record)
            assert record[f"{prefix}tools/{name}/errors"] == 0, (name, record)
        assert record[f"{prefix}env/turns/mean"] == len(turns), record
        assert record[f"{prefix}env/calls/mean"] == 2, record
        assert record[f"{prefix}env/well_formed_share"] == 1, record
        assert 0 < record[f"{prefix}env/reward/mean"] < 1, record
    # Groups of right and wrong episodes: advantages of both signs, and a gradient.
    assert last["batch/all_equal_groups_frac"] < 1, last
    assert last["critic/advantages/min"] < 0 < last["critic/advantages/max"], last
    assert last["actor/grad_norm"] > 0, last
