"""The vLLM backend refuses a temperature vLLM would change or reject, before it starts: vLLM
raises one in (0, 0.01) to 0.01 (its samples and logprobs would then not be those of the
temperature the trainer divides by: the importance weights biased in every step) and refuses
one above 2 (a run the JAX engine runs died at the first rollout)."""

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.sampler import SamplerContext
from jaxrl_llm.rollout.vllm_engine import VLLM_TEMPERATURES, check_temperature


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0.004), ("temperature", 2.5), ("val_temperature", 0.005)],
)
def test_a_temperature_vllm_would_change_is_refused_before_it_starts(field, value):
    from jaxrl_llm.rollout.vllm_sampler import VllmSampler

    ctx = SamplerContext(RolloutConfig(**{field: value}), None, None, None, None, 16)
    with pytest.raises(ConfigError, match=rf"rollout\.{field} = {value}.*vLLM.*0\.01 to 2"):
        VllmSampler(ctx)  # no checkpoint either: the temperature is refused first


def test_greedy_and_vllms_range_pass():
    for t in (0.0, 0.01, 0.7, 1.0, 2.0):
        check_temperature(t, "t")
    for t in (1e-6, 0.0099, 2.0001):
        with pytest.raises(ConfigError, match="t = "):
            check_temperature(t, "t")


@pytest.mark.slow  # imports vLLM: 8-18 s
def test_the_range_is_the_installed_vllms():
    from jaxrl_llm.rollout.vllm_engine import import_vllm

    vllm = import_vllm()
    low, high = VLLM_TEMPERATURES
    assert vllm.SamplingParams(temperature=low / 2).temperature == low  # raised, not kept
    assert vllm.SamplingParams(temperature=low).temperature == low
    assert vllm.SamplingParams(temperature=high).temperature == high
    with pytest.raises(Exception, match="temperature must be in") as refused:
        vllm.SamplingParams(temperature=high * 1.25)
    assert type(refused.value).__module__.startswith("vllm")  # vLLM's own validation
