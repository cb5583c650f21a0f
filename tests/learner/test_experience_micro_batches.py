"""The experience pass cuts its micro-batches as the update does: `micro_batch_size` rows,
or the whole mini-batch (batch / mini_batches) when that is smaller, so every split that
`RLConfig.validate` accepts runs (12 samples in 2 mini-batches of 6 with micro_batch_size 8
used to fail to reshape the batch into micro-batches of 8)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.experience import make_experience_fn
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.models import init_model
from jaxrl_llm.testing import register_test_rewards, tiny_config

from .rl_helpers import TINY_RL_PARAMS, random_rows

CFG = tiny_config()
PROMPTS, N, MINI_BATCHES, MICRO = 3, 4, 2, 8  # 12 samples, mini-batches of 6 < 8
SPLIT = (
    f"DataConfig.prompts_per_step = {PROMPTS}",
    f"RolloutConfig.n = {N}",
    f"AlgoConfig.mini_batches = {MINI_BATCHES}",
    f"AlgoConfig.micro_batch_size = {MICRO}",
)


def _config(*extra) -> RLConfig:
    parse_gin([], [*TINY_RL_PARAMS, *SPLIT, *extra])
    return RLConfig()


def test_experience_pass_cuts_the_update_s_micro_batches():
    """The pass built with micro_batch_size 8 for mini-batches of 6 runs micro-batches of 6:
    the same program, so the same bits, as the pass built with 6."""
    algo = _config().algo
    B, T = PROMPTS * N, 12
    rng = np.random.default_rng(0)
    ids, response = map(jnp.asarray, random_rows(rng, B, T, CFG.vocab_size))
    scores = jnp.asarray(rng.integers(0, 2, B).astype(np.float32))
    rollout = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32) - 3.0) * response
    graphdef, params = nnx.split(init_model(CFG, seed=1))

    def run(micro_batch):
        fn = make_experience_fn(graphdef, None, algo, temperature=0.7, group_size=N,
                                micro_batch=micro_batch)  # fmt: skip
        return jax.device_get(fn(params, None, None, ids, response, response, scores, rollout))

    got, want = run(MICRO), run(B // MINI_BATCHES)
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.slow  # one RL step of the tiny model
def test_a_step_runs_with_micro_batches_larger_than_its_mini_batches(tmp_path):
    """The experience pass (packed rows included) and the update of one real step."""
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS
    cfg = _config(f"RLConfig.run_dir = '{tmp_path}/run'", "RLConfig.steps = 1",
                  "RLConfig.save_every = 0")  # fmt: skip
    cfg.validate()
    assert cfg.algo.micro_batch_size > PROMPTS * N // MINI_BATCHES
    last = run_rl(cfg)[-1]
    assert last["actor/skipped"] == 0.0 and np.isfinite(last["actor/loss"])
