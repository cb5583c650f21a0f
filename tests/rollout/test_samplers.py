"""The sampler seam: backends by name or import path, checked at start-up; a plug-in backend
drives a whole RL run with no edit to the loop; clear errors for a bad name or a missing vLLM."""

import sys
from typing import ClassVar

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.rollout.backends import BACKENDS
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.sampler import Sampler, SamplerContext, build_sampler
from jaxrl_llm.testing import register_test_rewards
from tests.learner.rl_helpers import TINY_RL_PARAMS


class CountingSampler(JaxSampler):
    """A plug-in backend: the JAX engine, counting what the loop asks of it."""

    calls: ClassVar[dict[str, int]] = {"push_weights": 0, "generate": 0, "close": 0}

    def push_weights(self, params, version=None):
        self.calls["push_weights"] += 1
        return super().push_weights(params, version)

    def generate(self, *args, **kwargs):
        self.calls["generate"] += 1
        return super().generate(*args, **kwargs)

    def close(self):
        self.calls["close"] += 1
        super().close()

    def metrics(self):
        return {"rollout/counting/generates": float(self.calls["generate"])}


def counting_sampler(ctx: SamplerContext) -> CountingSampler:
    return CountingSampler(ctx)


def not_a_sampler(ctx: SamplerContext) -> object:
    return object()


def test_a_bad_backend_name_names_the_choices():
    with pytest.raises(ValueError, match=r"rollout.backend = 'vlm'.*jax, vllm"):
        RolloutConfig(backend="vlm")
    RolloutConfig(backend="package.module:factory")  # resolved when the run is built


def test_a_factory_without_the_contract_is_refused():
    ctx = SamplerContext(RolloutConfig(backend=f"{__name__}:not_a_sampler"), None, None, None,
                         None, max_prompt_length=8)  # fmt: skip
    with pytest.raises(TypeError, match=r"without the Sampler contract.*push_weights"):
        build_sampler(ctx)


def test_a_missing_vllm_is_a_config_error_naming_the_install(monkeypatch):
    from jaxrl_llm.rollout.vllm_engine import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ConfigError, match=r"needs vLLM.*pip install 'jaxrl-llm\[vllm\]'"):
        import_vllm()
    assert "vllm" in BACKENDS and "jax" in BACKENDS


@pytest.mark.slow
def test_a_plugin_backend_runs_the_loop(tmp_path):
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS
    params = [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path}'", "RLConfig.save_every = 0",
              "RLConfig.steps = 2", "RLConfig.eval_every = 2", "DataConfig.val_size = 2",
              f"RolloutConfig.backend = '{__name__}:counting_sampler'"]  # fmt: skip
    parse_gin([], params)
    CountingSampler.calls.update(push_weights=0, generate=0, close=0)
    records = run_rl(RLConfig())
    assert [r["step"] for r in records] == [0, 1, 2]  # validation at 0 and at the end
    assert isinstance(CountingSampler.__new__(CountingSampler), Sampler)
    # a push per step and one before each validation; a generate per step and val batch
    assert CountingSampler.calls["push_weights"] == 4
    assert CountingSampler.calls["generate"] >= 3
    assert CountingSampler.calls["close"] == 1  # closed when train ends
    assert records[2]["rollout/counting/generates"] >= 2  # the backend's own metrics


def test_the_jax_sampler_takes_the_rollout_configs_engine_settings():
    """`RolloutConfig.tool_workers` and `kv_cache_dtype` reach the JAX engine's driver and
    pool (the vLLM sampler sizes its tool threads from the same field and refuses the
    KV setting, tests/rollout/test_int8_sampler.py)."""
    from jaxrl_llm.models import ModelConfig, init_model
    from jaxrl_llm.models.kv_int8 import Int8Pages

    policy = init_model(ModelConfig(), seed=0)
    cfg = RolloutConfig(max_new_tokens=8, max_slots=2, tool_workers=7, kv_cache_dtype="int8")
    sampler = JaxSampler(SamplerContext(cfg, policy, None, None, None, 8))
    assert sampler.driver.tool_workers == 7
    assert isinstance(sampler.engine.init_decode_state().kv_pages[0], Int8Pages)
