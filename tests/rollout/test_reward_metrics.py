"""The rollout stage's per-reward metrics (issue #31 item 3): over a step's `generate` calls
(DAPO's tries), `reward/<name>/mean` is each reward's unweighted score averaged over every
sample scored, equal to scoring each sample with that reward alone, and
`timing/reward/<name>` its seconds; the streamed parts add up across scoring calls.

The stage samples with a scripted backend (`RolloutConfig.backend` as an import path): no
model, no compile; the rewards are a real `RewardPool` of two rule rewards."""

import numpy as np

from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.rewards.config import RewardConfig, build_rewards
from jaxrl_llm.rewards.pool import RewardPart
from jaxrl_llm.rewards.registry import build_reward
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.sampler import WeightPush
from jaxrl_llm.rollout.scoring import PartTotals, RewardCounts, StreamingScorer
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.types import Completion

BREVITY = "tests.rewards.example_reward:brevity"


class ScriptedSampler:
    """A `Sampler` whose sample i of a call says `\\boxed{(seed + i) % 3}` and pads to a
    length that varies with i; every sample is reported to `on_finish` as it is made."""

    policy_version = None

    def __init__(self, ctx):
        self.ctx = ctx

    def push_weights(self, params, version=None) -> WeightPush:
        return WeightPush(0, 0.0)

    def generate(self, prompts, sampling, *, tool=None, prompt_indices=None, on_finish=None,
                 progress=None):  # fmt: skip
        out = []
        for p, prompt in enumerate(prompts):
            for s in range(sampling.n):
                i = p * sampling.n + s
                text = rf"\boxed{{{(sampling.seed + i) % 3}}}" + "." * (3 * i)
                one = np.ones(1, np.int32)
                c = Completion(p, s, prompt, one, np.zeros(1, np.float32), None, one, "eos", text)
                if on_finish is not None:
                    on_finish(i, c)
                out.append(c)
        return out

    def metrics(self):
        return {}

    def release(self):
        pass

    def close(self):
        pass


def _batch() -> PromptBatch:
    ids = np.asarray([[5, 6, 7], [8, 9, 0]], np.int32)
    return PromptBatch(ids=["p0", "p1"], prompts=["q0", "q1"], answers=["1", "2"],
                       texts=["q0", "q1"], input_ids=ids,
                       prompt_lengths=np.asarray([3, 2], np.int32),
                       examples=[{"answer": "1", "max_chars": 10}, {"answer": "2"}],
                       index=0, epoch=0)  # fmt: skip


def test_stage_reports_each_reward_s_mean_over_every_try():
    cfg = RolloutConfig(backend=f"{__name__}:ScriptedSampler", n=3, max_new_tokens=8)
    stage = RolloutStage(cfg, None, None, None, max_prompt_length=4, seed=0)
    weights = {"math": 1.0, BREVITY: (0.5, {"max_chars": 6})}
    alone = {
        "math": build_reward("math", incorrect=0.0),
        BREVITY: build_reward(BREVITY, max_chars=6),
    }
    reward_cfg = RewardConfig(weights=weights, workers=2)
    scored: dict[str, list[float]] = {name: [] for name in weights}
    with build_rewards(reward_cfg) as pool:
        for attempt in (1, 2):  # two tries of one step (DAPO's dynamic sampling)
            batch = _batch()
            got = stage.generate(batch, step=1, attempt=attempt, reward=pool)
            rows = [e for e in batch.examples for _ in range(cfg.n)]
            texts = [c.text for c in got.completions]
            for name in weights:
                scored[name] += [alone[name](t, e) for t, e in zip(texts, rows, strict=True)]
            math, brev = scored["math"][-len(texts) :], scored[BREVITY][-len(texts) :]
            np.testing.assert_allclose(got.scores, np.add(math, np.multiply(0.5, brev)), rtol=1e-6)
    metrics = stage.reward_metrics()
    stage.close()
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0
    assert 0 < np.mean(scored["math"]) < 1 and 0 < np.mean(scored[BREVITY]) < 1
    for name in weights:
        np.testing.assert_allclose(
            metrics[f"reward/{name}/mean"], np.mean(scored[name]), rtol=1e-12
        )
        assert metrics[f"timing/reward/{name}"] > 0
    assert stage.reward_metrics()["reward/errors"] == 0  # read once: the next step starts at 0
    assert "reward/math/mean" not in stage.reward_metrics()


def test_streamed_parts_add_up_over_scoring_calls():
    """`RewardCounts` sums each call's `last_parts`; a NaN (no score) is left out."""

    class Parts:
        def __init__(self):
            self.last_failures = {}
            self.last_parts = {}

        def score(self, responses, examples):
            lengths = np.asarray([len(r) for r in responses], np.float64)
            lengths[lengths == 0] = np.nan  # an empty response: this reward has no score
            empty = int(np.isnan(lengths).sum())  # a count, as a judge's retries
            self.last_parts = {"len": RewardPart(lengths, 0.5, {"empty": empty})}
            return [float(len(r)) for r in responses]

    reward = Parts()
    scorer = StreamingScorer(reward, [{}] * 4)
    for i, text in enumerate(["a", "bbb", "", "cc"]):
        scorer.add(i, text)
    _, counts = scorer.result()
    calls = counts.parts["len"].seconds / 0.5
    assert counts.parts == {"len": PartTotals(6.0, 3, 0.5 * calls, {"empty": 1})} and calls >= 1
    both = counts + RewardCounts(parts={"other": PartTotals(1.0, 1, 0.0)})
    assert both.parts == {"len": counts.parts["len"], "other": PartTotals(1.0, 1, 0.0)}
