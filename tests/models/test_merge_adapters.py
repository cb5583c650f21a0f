"""`lora.merge_adapters` leaves its input alone: the model handed in keeps its adapters, and
every Variable it holds keeps its value, so a State that shares those Variables (the
trainer's frozen base and its KL reference, pushed to vLLM as `full_params(params,
frozen)` and merged there) is the same, bit for bit, however often it is merged."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.learner.lora import full_params, split_trainable
from jaxrl_llm.models import init_model, save_pretrained
from jaxrl_llm.models.hf_io import hf_tensors
from jaxrl_llm.models.lora import LoraConfig, apply_lora, has_adapters, merge_adapters
from jaxrl_llm.models.quant import int8_projections
from jaxrl_llm.testing import randomise_lora_b, tiny_config


def _values(state: nnx.State) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.array(v.get_value()) for p, v in nnx.to_flat_state(state)}


def _assert_same(state: nnx.State, before: dict[str, np.ndarray]) -> None:
    now = _values(state)
    assert now.keys() == before.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(now[key], value, err_msg=key, strict=True)


@pytest.mark.slow  # 11 s for the first case (its compiles), 1 s the second, 2 busy cores
@pytest.mark.parametrize("quantize_base", ["none", "int8"])
def test_merging_leaves_the_model_and_the_states_sharing_its_variables_untouched(
    quantize_base,
):
    policy = init_model(tiny_config(), seed=1)
    lora = LoraConfig(rank=4, quantize_base=quantize_base)
    graphdef, params, frozen, ref = split_trainable(policy, lora, seed=0, reference=True)
    assert frozen is not None and ref is not None
    randomise_lora_b(nnx.merge(graphdef, params, frozen))  # trained adapters: merging moves W
    before = {name: _values(s) for name, s in (("params", params), ("frozen", frozen))}
    before["ref"] = _values(ref)
    ids = jax.random.randint(jax.random.key(0), (2, 9), 0, tiny_config().vocab_size)
    want = np.asarray(nnx.merge(graphdef, params, frozen)(ids))
    for _ in range(2):  # as each weight push does: a module over the caller's Variables
        model = nnx.merge(graphdef, full_params(params, frozen))
        merged = merge_adapters(model)
        assert not has_adapters(merged)
        for name, state in (("params", params), ("frozen", frozen), ("ref", ref)):
            _assert_same(state, before[name])
        assert has_adapters(model)  # the input is not the merged model
        np.testing.assert_array_equal(np.asarray(model(ids)), want)
    _assert_same(nnx.state(policy, nnx.LoRAParam), before["params"])


@pytest.mark.parametrize(
    ("make", "fix"),
    [(lambda m: apply_lora(m, LoraConfig(rank=2), seed=0), "merge_adapters"),
     (lambda m: apply_lora(m, LoraConfig(rank=2, quantize_base="int8"), seed=0), "float"),
     (int8_projections, "float")],
    ids=["adapters", "adapters on an int8 base", "int8 weights"],
)  # fmt: skip
def test_save_pretrained_of_a_model_with_adapters_or_int8_weights_names_the_fix(
    tmp_path, make, fix
):
    model = init_model(tiny_config(), seed=0)
    make(model)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=fix) as error:
        save_pretrained(model, out)
    assert "\n" not in str(error.value)
    assert not out.exists()  # refused before anything is written
    with pytest.raises(ValueError, match=fix):
        next(hf_tensors(model))
