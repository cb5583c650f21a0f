"""Quantise-on-load (`from_pretrained(quantize=lora.int8_weights(cfg))`): bit for bit and
laid out as loading the float model and quantising in `apply_lora`, without the float
weights ever resident together; the RL learner loads an int8 LoRA base that way."""

import gc

import gin
import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import build_learner
from jaxrl_llm.models import from_pretrained, hf_io, init_model, save_pretrained
from jaxrl_llm.models.lora import LoraConfig, apply_lora, int8_weights
from jaxrl_llm.sharding import build_mesh
from jaxrl_llm.testing import tiny_config

from .rl_helpers import TINY_RL_PARAMS

# o_proj has two input dims, down_proj another width; the other projections stay float.
LORA = LoraConfig(rank=4, targets=("q_proj", "o_proj", "down_proj"), quantize_base="int8")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    save_pretrained(init_model(tiny_config(), seed=1), path)
    return path


def _flat(model):
    return {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.slow  # 11 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("mesh_shape", [None, (1, 2, 4)])
def test_quantised_as_read_equals_quantised_after_loading(checkpoint, mesh_shape):
    mesh = None if mesh_shape is None else build_mesh(*mesh_shape)
    after = from_pretrained(checkpoint, mesh=mesh)
    apply_lora(after, LORA, seed=0)
    read = from_pretrained(checkpoint, mesh=mesh, quantize=int8_weights(LORA))
    assert sum(name.endswith("_qscale") for name in _flat(read)) == 3 * tiny_config().num_layers
    apply_lora(read, LORA, seed=0)
    want, got = _flat(after), _flat(read)
    assert sorted(got) == sorted(want)
    int8 = [name for name, x in got.items() if x.dtype == np.int8]
    assert len(int8) == 3 * tiny_config().num_layers
    assert all(name.rsplit("/", 1)[-1] in LORA.targets for name in int8)
    for name, x in want.items():
        assert got[name].dtype == x.dtype, name
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(x), err_msg=name)
        if mesh is not None:
            assert got[name].sharding.is_equivalent_to(x.sharding, x.ndim), name
    ids = np.random.default_rng(0).integers(0, tiny_config().vocab_size, (2, 9))
    np.testing.assert_array_equal(np.asarray(read(ids)), np.asarray(after(ids)))


def test_the_float_weights_are_never_resident_together(checkpoint, monkeypatch):
    """The bytes alive when each weight is quantised stay below what the float model needs:
    loading everything first, then quantising, would reach it at the last weight."""
    quantize, live = hf_io.quantize_variable, []

    def counting(var, in_dims):
        live.append(sum(x.nbytes for x in jax.live_arrays()))
        return quantize(var, in_dims)

    monkeypatch.setattr(hf_io, "quantize_variable", counting)
    everything = LoraConfig(rank=4, quantize_base="int8")  # all seven projections
    float_model = from_pretrained(checkpoint)
    float_bytes = sum(x.nbytes for x in _flat(float_model).values())
    adapted = sum(x.nbytes for n, x in _flat(float_model).items() if n.endswith("_proj"))
    del float_model
    gc.collect()
    before = sum(x.nbytes for x in jax.live_arrays())
    model = from_pretrained(checkpoint, quantize=int8_weights(everything))
    assert len(live) == 7 * tiny_config().num_layers
    peak = max(live) - before
    # Everything but the projections, a quarter of them (int8) and the one being quantised.
    assert peak < float_bytes - adapted / 2, (peak, float_bytes, adapted)
    assert sum(x.nbytes for x in _flat(model).values()) < float_bytes - adapted / 2


@pytest.mark.slow  # 15 s in a loaded 2-worker run, AMD EPYC AVX2
def test_the_learner_loads_an_int8_lora_base_as_it_reads_it(monkeypatch):
    calls = []
    quantize = hf_io.quantize_variable
    monkeypatch.setattr(hf_io, "quantize_variable", lambda *a: calls.append(a) or quantize(*a))
    lora = ["PolicyConfig.lora = @LoraConfig()", "LoraConfig.quantize_base = 'int8'"]
    parse_gin([], [*TINY_RL_PARAMS, *lora])
    try:
        learner = build_learner(RLConfig())
    finally:
        gin.clear_config()
    layers = learner.policy.config.num_layers
    assert len(calls) == 7 * layers  # every projection, as it was read
    assert learner.frozen is not None
    frozen = jax.tree.leaves(learner.frozen)
    assert sum(x.dtype == np.int8 for x in frozen) == 7 * layers
