"""`rl_loop._collect`'s per-sample rollout metrics describe the batch that is trained, also
when DAPO's dynamic sampling draws several batches and keeps some groups of each."""

from types import SimpleNamespace

import numpy as np

from jaxrl_llm.learner import rl_loop
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.types import Completion, Rollout

G = 2


def _completion(b: int, finish: str, calls: int) -> Completion:
    z = np.zeros(1, np.int32)
    mask = np.ones(1, np.int32)
    lp = np.zeros(1, np.float32)
    return Completion(b // G, b % G, z, z, lp, None, mask, finish, "", tool_calls=calls)


def _rollout(finishes: list[str], scores: list[float], calls: list[int]) -> Rollout:
    comps = tuple(_completion(b, f, c) for b, (f, c) in enumerate(zip(finishes, calls)))
    prompts = len(finishes) // G
    return Rollout(
        completions=comps, answers=("",) * len(comps),
        prompt_ids=tuple(f"p{len(finishes)}_{i}_{finishes[0]}" for i in range(prompts)),
        scores=np.asarray(scores, np.float32), group_size=G, policy_version=1,
    )  # fmt: skip


class _Stage:
    """The rollout stage's interface to `_collect`, generating the given rollouts in turn;
    `env_metrics` is the real one (a tool that reports no metrics of its own)."""

    env_metrics = RolloutStage.env_metrics

    def __init__(self, tries: list[Rollout]):
        self.tries, self.tool = iter(tries), SimpleNamespace()
        self.sampler = SimpleNamespace(metrics=lambda: {})

    def generate(self, *args):
        return next(self.tries)

    def sync_weights(self, params):
        return SimpleNamespace(bytes=0)

    def release_weights(self):
        pass

    def reward_metrics(self):
        return {}

    def tool_metrics(self, step):
        return {}


def test_dynamic_sampling_metrics_describe_the_trained_batch(tmp_path):
    # Try 1: group 0 all-equal (dropped), group 1 mixed. Try 2: both mixed, one needed.
    first = _rollout(["eos", "eos", "length", "length"], [1, 1, 0, 1], [0, 0, 0, 0])
    second = _rollout(["stop", "stop", "eos", "eos"], [0, 1, 0, 1], [1, 1, 0, 0])
    cfg = SimpleNamespace(
        rollout=SimpleNamespace(n=G), data=SimpleNamespace(prompts_per_step=2),
        algo=SimpleNamespace(dynamic_sampling=True, max_sampling_tries=3),
    )  # fmt: skip
    prompts = iter([SimpleNamespace(index=0), SimpleNamespace(index=1)])
    trained, metrics = rl_loop._collect(
        cfg, 1, prompts, _Stage([first, second]), None, None, 1, run_dir=tmp_path,  # pyright: ignore[reportArgumentType]
    )  # fmt: skip
    assert metrics["dynamic_sampling/tries"] == 2
    assert [c.finish_reason for c in trained.completions] == ["length", "length", "stop", "stop"]
    # The trained batch's shares and tool calls, not the first try's (eos 0.5, calls 0)
    assert metrics["rollout/finish/length"] == 0.5
    assert metrics["rollout/finish/stop"] == 0.5
    assert metrics["rollout/finish/eos"] == 0.0
    assert metrics["env/tool_calls/mean"] == 0.5
