"""Environment episodes through the real `RolloutDriver` (scripted policy): prompts are the
environments' reset messages rendered with their tools, each turn is a `step`, rewards
combine by the configured rule, every environment is closed (also when generation fails),
and a wrong environment fails at start-up."""

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from jaxrl_llm.agents import EpisodeConfig, Episodes, StepResult, combine_rewards
from jaxrl_llm.agents.arithmetic import ArithmeticEnv
from jaxrl_llm.agents.episodes import summarise
from jaxrl_llm.agents.factory import env_factory
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.experience import turn_token_rewards
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.testing import ScriptedEngine

HERE = Path(__file__).parent
ROW = {"id": "r0", "prompt": "Sam buys 8 boxes of 4 books. How many books is that?", "answer": "32"}
MULTIPLY = '<tool_call>{"name": "multiply", "arguments": {"a": 8, "b": 4}}</tool_call><|im_end|>'
ANSWER = "So \\boxed{32}.<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _run(tokenizer, factory, turns, *, n=1, max_turns=4, cfg=None, rows=(ROW,)):
    episodes = Episodes(factory, list(rows), n, tokenizer, cfg or EpisodeConfig())
    driver = RolloutDriver(ScriptedEngine(tokenizer, turns), tokenizer, max_tool_turns=max_turns)
    try:
        out = driver.generate(
            episodes.prompts, SamplingParams(max_new_tokens=1024, n=n), tool=episodes
        )
        scores = [episodes.finish(i, c) for i, c in enumerate(out)]
    finally:
        episodes.close()
    return episodes, out, scores


@pytest.mark.parametrize(
    ("rule", "gamma", "want"),
    [("final", 1.0, 3.0), ("sum", 1.0, 4.5), ("discounted", 0.5, 0.5 * 0.25 + 1.0 * 0.5 + 3.0)],
)
def test_reward_rules(rule, gamma, want):
    assert combine_rewards([0.5, 1.0, 3.0], rule, gamma) == pytest.approx(want, abs=0)
    assert combine_rewards([], rule, gamma) == 0.0
    with pytest.raises(ValueError, match="expected one of final, sum, discounted"):
        combine_rewards([1.0], "mean")


def test_an_arithmetic_episode_is_token_exact_scored_and_counted(tokenizer):
    episodes, (c,), scores = _run(tokenizer, ArithmeticEnv, [MULTIPLY, ANSWER], n=1)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": ROW["prompt"]}], tools=ArithmeticEnv().tools,
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert "tools: add(a, b) subtract(a, b) multiply(a, b) divide(a, b)" in prompt
    assert episodes.prompts[0].tolist() == _ids(tokenizer, prompt)
    obs = "\n<|im_start|>tool\n32<|im_end|>\n<|im_start|>assistant\n"
    parts = [(MULTIPLY, 1), (obs, 0), (ANSWER, 1)]
    assert c.token_ids.tolist() == [t for text, _ in parts for t in _ids(tokenizer, text)]
    np.testing.assert_array_equal(
        c.response_mask, [m for text, m in parts for _ in _ids(tokenizer, text)]
    )
    assert scores == [1.0] and (c.finish_reason, c.tool_calls) == ("eos", 1)
    m = summarise(episodes.metrics())
    assert m["env/turns/mean"] == 2 and m["env/calls/mean"] == 1
    assert m["env/well_formed_share"] == 1.0 and m["env/reward/mean"] == 1.0
    assert m["tools/multiply/calls"] == 1 and m["tools/add/calls"] == 0


def test_the_turn_limit_ends_with_a_final_step(tokenizer):
    """Cut after one observation: the second call is a final turn, scored, never run."""
    episodes, (c,), scores = _run(tokenizer, ArithmeticEnv, [MULTIPLY, MULTIPLY], max_turns=1)
    assert (c.tool_calls, scores) == (1, [0.0])
    m = summarise(episodes.metrics())
    assert m["tools/multiply/calls"] == 1 and m["env/turns/mean"] == 2


class _Scripted:
    """Rewards 0.5 per turn, 2 at the end; counts resets, steps and closes."""

    log: ClassVar[list[str]] = []

    def __init__(self):
        self.tools = []

    def reset(self, row):
        self.log.append("reset")
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        self.log.append("step")
        if "boxed" in turn.text or turn.final:
            return StepResult(reward=2.0, done=True)
        return StepResult([{"role": "tool", "content": "ok"}], reward=0.5, metrics={"x": 1.0})

    def close(self):
        self.log.append("close")


def test_turn_rewards_combine_by_the_rule_and_every_env_closes(tokenizer):
    _Scripted.log = []
    cfg = EpisodeConfig(reward_rule="discounted", discount=0.5)
    episodes, out, scores = _run(tokenizer, _Scripted, ["a<|im_end|>", "b<|im_end|>", ANSWER],
                                 n=2, cfg=cfg)  # fmt: skip
    assert scores == [0.5 * 0.25 + 0.5 * 0.5 + 2.0] * 2
    assert [c.tool_calls for c in out] == [2, 2]
    assert _Scripted.log.count("reset") == 2 and _Scripted.log.count("close") == 2
    assert summarise(episodes.metrics())["x"] == 4.0  # two turns x two episodes


def test_per_turn_rewards_land_on_each_turns_last_token(tokenizer):
    """`reward_placement = "turns"`: the completion carries the turn rewards, and
    `turn_token_rewards` puts each on the last token of its model turn (the runs of mask 1),
    summing to the score."""
    _Scripted.log = []
    cfg = EpisodeConfig(reward_rule="sum", reward_placement="turns")
    episodes, out, scores = _run(tokenizer, _Scripted, ["a<|im_end|>", "b<|im_end|>", ANSWER],
                                 n=2, cfg=cfg)  # fmt: skip
    placed = [episodes.placed(i, c) for i, c in enumerate(out)]
    assert [c.turn_rewards for c in placed] == [(0.5, 0.5, 2.0)] * 2
    rows = turn_token_rewards(placed, 512)
    c, P = placed[0], len(placed[0].prompt_ids)
    mask = np.asarray(c.response_mask)
    ends = [t for t in range(len(mask)) if mask[t] and (t + 1 == len(mask) or not mask[t + 1])]
    assert len(ends) == 3 and ends[-1] == len(mask) - 1
    np.testing.assert_array_equal(np.flatnonzero(rows[0]), [P + t for t in ends])
    np.testing.assert_array_equal(rows[0][[P + t for t in ends]], [0.5, 0.5, 2.0])
    assert rows.sum(1).tolist() == scores == [3.0, 3.0]
    assert episodes.placed(0, out[0]) is not out[0]
    plain = Episodes(_Scripted, [ROW], 1, tokenizer, EpisodeConfig(reward_rule="sum"))
    plain.close()
    assert plain.placed(0, out[0]) is out[0]  # "end": the score alone, on the last token
    with pytest.raises(ConfigError, match="reward_rule = 'sum'"):
        EpisodeConfig(reward_placement="turns")


def test_envs_close_when_generation_fails(tokenizer):
    _Scripted.log = []
    episodes = Episodes(_Scripted, [ROW, ROW], 2, tokenizer, EpisodeConfig())
    engine = ScriptedEngine(tokenizer, ["a<|im_end|>"], max_prefill_length=8)  # prompts too long
    with pytest.raises(ValueError, match="cannot be generated"):
        try:
            RolloutDriver(engine, tokenizer).generate(episodes.prompts, SamplingParams(n=2),
                                                      tool=episodes)  # fmt: skip
        finally:
            episodes.close()
    assert _Scripted.log.count("close") == 4


def test_wrong_environments_fail_at_start_up(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    with pytest.raises(ValueError, match=r"rollout.env = 'chess': expected 'none', one of"):
        RolloutConfig(env="chess")
    with pytest.raises(ValueError, match="an environment brings its own tools"):
        RolloutConfig(env="arithmetic", tool="python")
    with pytest.raises(TypeError, match=r"without the environment contract.*'reset', 'step'"):
        env_factory("builtins:dict")
    with pytest.raises(ImportError, match=r"rollout.env = 'env_example:nope'"):
        env_factory("env_example:nope")
    assert env_factory("env_example:make_env")().tools[0]["function"]["name"] == "lookup"


def test_a_reset_must_give_a_group_one_prompt(tokenizer):
    class Moody(_Scripted):
        count = 0

        def reset(self, row):
            Moody.count += 1
            return [{"role": "user", "content": f"{row['prompt']} {Moody.count}"}]

    with pytest.raises(ValueError, match="must share their prompt"):
        Episodes(Moody, [ROW], 2, tokenizer, EpisodeConfig())


def test_a_budget_cut_observation_is_not_part_of_the_final_turn(tokenizer):
    """The observation after the first turn does not fit: the episode ends ("length") and
    its final step reads the model's last turn, not the cut observation."""
    seen = []

    class Long(_Scripted):
        def step(self, turn):
            seen.append((turn.text, turn.final))
            if turn.final:
                return StepResult(reward=1.0, done=True)
            return StepResult([{"role": "tool", "content": "x" * 400}])

    turn = "first<|im_end|>"
    episodes = Episodes(Long, [ROW], 1, tokenizer, EpisodeConfig())
    driver = RolloutDriver(ScriptedEngine(tokenizer, [turn, "again<|im_end|>"]), tokenizer)
    budget = len(_ids(tokenizer, turn)) + 50
    (c,) = driver.generate(episodes.prompts, SamplingParams(max_new_tokens=budget), tool=episodes)
    assert c.finish_reason == "length" and 0 in c.response_mask
    assert episodes.finish(0, c) == 1.0
    episodes.close()
    assert seen == [("first", False), ("first", True)]
