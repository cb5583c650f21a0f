"""LLM judges (issue #31 item 2, `rollout.judge`): the verdict is the judge checkpoint's own
greedy continuation of its chat-template prompt (checked against full recomputation), a
verdict that does not parse is asked again at a temperature with seeds fixed by the prompt
(not by the batch), and what the judge counted reaches the step's metrics.

The retry and metric tests script the judge's sampler (`Sampler` contract): no model."""

import dataclasses
from typing import ClassVar

import gin
import numpy as np
import pytest

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rewards.combined import ModelAndRuleRewards
from jaxrl_llm.rewards.config import RewardConfig, build_reward_pool, build_rewards
from jaxrl_llm.rewards.judge_config import JudgeConfig
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.judge import Judge
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.types import Completion
from tests.rollout.reference import naive_greedy
from tests.rollout.test_reward_metrics import _batch

EXAMPLE = {"prompt": "What is 2 + 3?", "answer": "5"}


@pytest.fixture(autouse=True)
def _empty_gin():
    """The configs here are built directly: no binding left by another test applies."""
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


class ScriptedJudge:
    """A judge's sampler: greedy verdicts parse unless the judged response says "retry"
    (then only sampled ones do) or "never" (none does); a response saying "right" gets 1,
    any other 0. Records each call's sampling and seed indices."""

    policy_version = None

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, prompts, sampling, *, prompt_indices=None, **_):
        self.calls.append((sampling, list(prompt_indices), len(prompts)))
        out = []
        for p, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            response = text.split("Student's response:")[1]
            verdict = rf"\boxed{{{int('right' in response)}}}"
            if "never" in response or ("retry" in response and sampling.temperature == 0):
                verdict = "I cannot decide."
            one = np.ones(1, np.int32)
            out.append(Completion(p, 0, prompt, one, np.zeros(1, np.float32), None, one, "eos",
                                  verdict))  # fmt: skip
        return out

    def close(self):
        pass


def test_unparsed_verdicts_are_asked_again_and_counted(tokenizer):
    sampler = ScriptedJudge(tokenizer)
    judge = Judge(sampler, tokenizer, JudgeConfig(retries=2, unparsed_score=-1.0), "judge:x")
    responses = ["right", "wrong", "retry, right", "never"]
    scores = judge.score(responses, [EXAMPLE] * 4)
    np.testing.assert_array_equal(scores, np.float32([1, 0, 1, -1]))
    assert judge.last_counts == {"retries": 3, "unparsed": 1, "too_long": 0}
    temperatures = [s.temperature for s, _, _ in sampler.calls]
    assert temperatures == [0.0, 0.7, 0.7] and [n for *_, n in sampler.calls] == [4, 2, 1]
    assert [s.seed for s, _, _ in sampler.calls] == [0, 1, 2]
    assert judge.last_verdicts[3] == "I cannot decide."


def test_a_response_s_seeds_do_not_depend_on_the_batch(tokenizer):
    """A re-ask's randomness is fixed by the prompt's tokens: the same response scored alone
    and among others is asked with the same seed index."""
    alone, among = ScriptedJudge(tokenizer), ScriptedJudge(tokenizer)
    Judge(alone, tokenizer, JudgeConfig(), "judge:x").score(["retry"], [EXAMPLE])
    Judge(among, tokenizer, JudgeConfig(), "judge:x").score(
        ["right", "retry"], [{"prompt": "other", "answer": "1"}, EXAMPLE]
    )
    assert alone.calls[1][1] == among.calls[1][1] and among.calls[0][1][1] == alone.calls[0][1][0]


def test_a_prompt_over_the_limit_is_not_judged(tokenizer):
    sampler = ScriptedJudge(tokenizer)
    judge = Judge(sampler, tokenizer, JudgeConfig(), "judge:x")
    (short,) = judge.prompts(["right"], [EXAMPLE])
    judge.config = JudgeConfig(max_prompt_length=len(short))
    scores = judge.score(["right", "right!"], [EXAMPLE] * 2)
    np.testing.assert_array_equal(scores, np.float32([1, 0]))
    assert judge.last_counts["too_long"] == 1 and [n for *_, n in sampler.calls] == [1]


def test_the_step_reports_the_judge_s_mean_and_counts(tokenizer):
    """Through the rollout stage (scripted policy): `reward/judge:x/{mean,retries,...}`."""
    from tests.rollout.test_reward_metrics import ScriptedSampler  # noqa: F401 (the backend)

    cfg = RolloutConfig(backend="tests.rollout.test_reward_metrics:ScriptedSampler", n=3)
    stage = RolloutStage(cfg, None, None, None, max_prompt_length=4, seed=0)
    judge = Judge(ScriptedJudge(tokenizer), tokenizer, JudgeConfig(), "judge:/m/x")
    with ModelAndRuleRewards(None, [(judge, 2.0)]) as reward:
        batch = _batch()
        rows = [{**e, "prompt": q} for e, q in zip(batch.examples, batch.prompts, strict=True)]
        got = stage.generate(dataclasses.replace(batch, examples=rows), step=1, attempt=1,
                             reward=reward)  # fmt: skip
    metrics = stage.reward_metrics()
    stage.close()
    # The scripted policy writes \boxed{k}...: no "right", so every verdict is \boxed{0}.
    assert list(got.scores) == [0.0] * 6 and metrics["reward/judge:x/mean"] == 0.0
    assert metrics["reward/judge:x/retries"] == 0 and metrics["reward/judge:x/unparsed"] == 0
    assert metrics["timing/reward/judge:x"] > 0


def test_judges_are_refused_where_no_factory_is_given():
    cfg = RewardConfig(name="judge:builtin")
    with pytest.raises(ConfigError, match="judge"):
        build_reward_pool(cfg)
    with pytest.raises(ConfigError, match="take judges"):
        build_rewards(cfg)


@pytest.mark.slow
def test_the_verdict_is_the_judge_s_greedy_continuation():
    """`judge:builtin`, loaded through `build_rewards` as `train` does: a first verdict's
    tokens equal greedy decoding by full recomputation of the chat-template prompt with the
    same weights, and a second call (its re-asks sampled) scores and says the same."""
    from jaxrl_llm.rollout.judge import build_judge

    config = {"max_new_tokens": 6, "retries": 1, "parser": "number", "max_slots": 4}
    cfg = RewardConfig(weights={"judge:builtin": (1.0, config)})
    responses = ["2 + 3 = 5, so \\boxed{5}", "I think it is 6"]
    with build_rewards(cfg, judges=build_judge) as reward:
        ((judge, _),) = reward.models
        first = reward.score(responses, [EXAMPLE] * 2)
        said = reward.last_verdicts
        again = reward.score(responses, [EXAMPLE] * 2)
        assert reward.last_verdicts == said
        prompts = judge.prompts(responses, [EXAMPLE] * 2)
        greedy = judge._ask(prompts, attempt=0)
    model, eos = _judge_model(), (judge.tokenizer.eos_token_id,)
    for prompt, verdict in zip(prompts, greedy, strict=True):
        want = naive_greedy(model, list(prompt), 6, eos=eos, width=512)
        assert judge.tokenizer.decode(want, skip_special_tokens=True) == verdict
    np.testing.assert_array_equal(first, again)


def _judge_model():
    from jaxrl_llm.models import CausalLM, from_pretrained

    model = from_pretrained(builtin_checkpoint(), dtype="float32")
    assert isinstance(model, CausalLM)
    return model


class _Recorded:
    """A sampler factory's stand-in: keeps the context it was built with, samples nothing."""

    contexts: ClassVar[list] = []

    def __init__(self, ctx):
        self.contexts.append(ctx)
        self.policy_version = None

    push_weights = generate = metrics = release = close = lambda self, *a, **k: None


@pytest.mark.parametrize("places_itself", [False, True])
def test_the_judge_gives_its_mesh_to_a_backend_on_jax_devices_only(monkeypatch, places_itself):
    """The judge reads the backend's record (`rollout.backends`), not its name: one on JAX
    devices samples on the judge's own mesh, one that places itself (vLLM) is given none."""
    from jaxrl_llm.rollout import backends

    record = backends.Backend(f"{__name__}:_Recorded", "", places_itself=places_itself)
    monkeypatch.setitem(backends.BACKENDS, "jax", record)
    _Recorded.contexts.clear()
    judge = Judge.load("judge:builtin", JudgeConfig(backend="jax"))
    (ctx,) = _Recorded.contexts
    assert isinstance(judge.sampler, _Recorded)
    assert (ctx.sampling_mesh is None) == places_itself
    assert ctx.sampling_mesh is None or ctx.sampling_mesh is ctx.mesh
    assert backends.takes_devices("jax") != places_itself
    assert backends.takes_devices("package.module:factory")  # a plug-in is given them
