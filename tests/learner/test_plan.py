"""`jaxrl-llm plan`: the estimate tracks XLA's compiled memory analysis of the real step."""

import dataclasses
import json

import jax
import pytest

from jaxrl_llm import cli
from jaxrl_llm.learner.plan import Workload, plan_memory
from jaxrl_llm.learner.plan_check import xla_step_bytes
from jaxrl_llm.learner.plan_shapes import (
    SHAPES,
    abstract_mesh,
    model_config,
    param_bytes,
    shard_numel,
)
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.sharding import build_mesh
from jaxrl_llm.sharding.rules import TRAIN_RULES

SMALL = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip


# None of these was among the configs the activation counts were fitted on.
@pytest.mark.slow  # measured: XLA compiles, 10 s for three on 2 cores (docs/testing.md)
@pytest.mark.parametrize(
    "cfg, mesh_shape, work",
    [
        (model_config("builtin"), (1, 1, 1), Workload(micro_batch=4, seq_len=96)),
        (SMALL, (2, 2, 1), Workload(micro_batch=8, seq_len=64)),
        (SMALL, (1, 2, 2), Workload(micro_batch=4, seq_len=128, micro_batches=4)),
        # Two micro-batches: the scan still runs one at a time (`state.accumulate`).
        (model_config("builtin"), (1, 1, 1), Workload(micro_batch=4, seq_len=128, micro_batches=2)),
    ],
    ids=["tiny-qwen2", "data2-fsdp2", "fsdp2-tensor2", "two-micro-batches"],
)
def test_estimate_within_15_percent_of_xla(cfg, mesh_shape, work):
    n = mesh_shape[0] * mesh_shape[1] * mesh_shape[2]
    mesh = build_mesh(*mesh_shape, devices=jax.devices()[:n])
    xla = xla_step_bytes(cfg, mesh, work)["total"]
    plan = plan_memory(cfg, mesh_shape, work)
    assert plan.train_step == pytest.approx(xla, rel=0.15), (plan.train_step, xla)
    assert plan.terms["activations"] > 0.3 * plan.train_step  # not a parameter-only check


@pytest.mark.slow  # measured: 5 s on 2 cores (docs/testing.md)
def test_named_shapes_match_published_parameter_counts():
    one = abstract_mesh(1, 1, 1)
    counts = {k: param_bytes(model_config(k), one, TRAIN_RULES)[1] for k in SHAPES}
    assert counts["qwen2.5-0.5b"] == pytest.approx(0.494e9, rel=0.01)
    assert counts["qwen2.5-1.5b"] == pytest.approx(1.544e9, rel=0.01)
    assert counts["qwen2.5-7b"] == pytest.approx(7.616e9, rel=0.01)
    assert counts["llama3-8b"] == pytest.approx(8.030e9, rel=0.01)
    assert model_config("/ckpts/Qwen2.5-Math-7B").num_layers == 28


def test_shards_follow_rules_and_divisibility():
    mesh = abstract_mesh(1, 2, 4)
    # q_proj [D, N, H]: D over fsdp, N over tensor.
    assert shard_numel((64, 8, 16), ("embed", "heads", "head_dim"), TRAIN_RULES, mesh) == 8192 // 8
    # 2 KV heads do not divide over tensor=4: replicated there.
    assert (
        shard_numel((64, 2, 16), ("embed", "kv_heads", "head_dim"), TRAIN_RULES, mesh) == 2048 // 2
    )


def test_remat_and_sharding_reduce_the_estimate():
    work = Workload(micro_batch=8, seq_len=256, slots=16, cache_len=257)
    base = plan_memory(SMALL, (1, 1, 1), work)
    assert plan_memory(SMALL.replace(remat=True), (1, 1, 1), work).peak < base.peak
    sharded = plan_memory(SMALL, (1, 4, 1), work)
    assert sharded.terms["params"] == pytest.approx(base.terms["params"] / 4, rel=0.02)
    # The paged KV pool splits over the batch axes as the slots do, and over kv heads.
    assert sharded.terms["kv_cache"] == base.terms["kv_cache"] // 4
    assert plan_memory(SMALL, (1, 1, 2), work).terms["kv_cache"] == base.terms["kv_cache"] // 2
    pages = 16 * -(-257 // 32)  # slots x pages per sequence
    assert base.terms["kv_cache"] == 2 * 2 * pages * 32 * 2 * 16 * 4  # k, v x L x tokens x K x H


def test_overlapped_rollout_counts_its_weight_copies_and_both_phases():
    work = Workload(micro_batch=8, seq_len=256, slots=16, cache_len=257)
    sync = plan_memory(SMALL, (1, 1, 1), work)
    ahead = plan_memory(SMALL, (1, 1, 1), dataclasses.replace(work, max_staleness=2))
    assert sync.terms["overlap_weights"] == 0
    assert ahead.terms["overlap_weights"] == 3 * sync.terms["params"]  # k + 1 copies
    assert ahead.peak == (sync.resident + 3 * sync.terms["params"] + sync.train_phase
                          + sync.rollout_phase)  # fmt: skip
    assert ahead.peak > sync.peak


@pytest.mark.slow  # 11 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize(
    "weights, dtype, fsdp",
    [("same", None, 1), ("same", None, 2), ("same", "bfloat16", 1), ("int8", None, 1),
     ("w8a8", "bfloat16", 2)],
)  # fmt: skip
def test_the_sampler_copy_is_the_bytes_the_sampler_holds(weights, dtype, fsdp):
    """`rollout_weights`: a copy only when the sync makes one (another layout, a cast or
    int8), of the bytes the JAX sampler's params take on one device after a push."""
    from flax import nnx

    from jaxrl_llm.models import init_model
    from jaxrl_llm.rollout.config import RolloutConfig
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.sampler import SamplerContext

    mesh = build_mesh(fsdp=fsdp, devices=jax.devices()[:fsdp])
    policy = init_model(SMALL, seed=0, mesh=mesh)
    cfg = RolloutConfig(max_new_tokens=8, max_slots=2, weights=weights)
    sampler = JaxSampler(SamplerContext(cfg, policy, None, mesh, None, 8, dtype))
    sampler.push_weights(nnx.state(policy))
    held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(sampler.params))
    work = Workload(micro_batch=2, seq_len=16, slots=2, cache_len=17, rollout_dtype=dtype,
                    sampler_weights=weights)  # fmt: skip
    planned = plan_memory(SMALL, (1, fsdp, 1), work).terms["rollout_weights"]
    pointer = fsdp == 1 and dtype is None and weights == "same"
    assert planned == (0 if pointer else held)


@pytest.mark.slow  # 9 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_devices_set_apart_hold_the_sampler_and_the_trainers_do_not(kv_dtype):
    """`MeshConfig.rollout_devices = 4` of 8 with tensor 2: each sampler device holds what a
    JAX sampler on that (2, 1, 2) mesh holds after a push (its weights, always a copy, and
    its paged KV pool, float or int8 with its scales), a trainer device neither; the peak is
    the larger kind of device."""
    from flax import nnx

    from jaxrl_llm.learner.plan import _sampling_copy_bytes  # the same-device rule, below
    from jaxrl_llm.models import init_model
    from jaxrl_llm.rollout.config import RolloutConfig
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.sampler import SamplerContext
    from jaxrl_llm.sharding.mesh import sampler_mesh_shape

    devices = jax.devices()
    assert sampler_mesh_shape(4, 2) == (2, 1, 2) and sampler_mesh_shape(3, 2) == (3, 1, 1)
    train_mesh = build_mesh(1, -1, 2, devices=devices[:4])
    sampling_mesh = build_mesh(*sampler_mesh_shape(4, 2), devices=devices[4:])
    policy = init_model(SMALL, seed=0, mesh=train_mesh)
    cfg = RolloutConfig(max_new_tokens=8, max_slots=4, kv_cache_dtype=kv_dtype)
    ctx = SamplerContext(cfg, policy, None, train_mesh, None, 8, sampling_mesh=sampling_mesh)
    sampler = JaxSampler(ctx)
    sampler.push_weights(nnx.state(policy))
    per_device = lambda tree: sum(
        x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree)
    )
    weights = per_device(sampler.params)
    kv = per_device(sampler.engine.init_decode_state().kv_pages)
    work = Workload(micro_batch=2, seq_len=16, slots=4, cache_len=17, rollout_devices=4,
                    sampler_mesh=(2, 1, 2), kv_cache_dtype=kv_dtype)  # fmt: skip
    plan = plan_memory(SMALL, (1, 2, 2), work)
    no_scorers = {"reward_models": 0, "judges": 0, "scoring": 0}
    assert plan.sampler_terms == {"rollout_weights": weights, "kv_cache": kv, **no_scorers}
    assert plan.terms["rollout_weights"] == plan.terms["kv_cache"] == 0
    assert plan.peak == max(plan.trainer_peak, weights + kv)
    shared = plan_memory(SMALL, (1, 2, 2), dataclasses.replace(work, rollout_devices=0))
    assert shared.sampler_terms == {} and shared.terms["kv_cache"] > 0
    assert _sampling_copy_bytes(SMALL, abstract_mesh(2, 1, 2), work) == 0  # a pointer there
    out = plan.to_json()
    assert out["bytes_per_sampler_device"]["peak"] == weights + kv and out["peak"] == plan.peak


@pytest.mark.slow  # 22 s in a loaded 2-worker run, AMD EPYC AVX2
def test_cli_says_what_to_change(capsys):
    # The shipped LIMR config with a micro-batch that does not split over the 64 devices
    # (8 sequences, so each device runs all 8) does not fit 64 GB; a suggestion does.
    argv = ["plan", "--gin_file=limr_ppo_qwen2.5_math_7b.gin", "--json", "--devices=64",
            '--gin_param=CHECKPOINT="/ckpts/Qwen2.5-Math-7B"', "--device-memory-gb=64",
            '--gin_param=TRAIN_FILE="/data/limr/math.8k.json"',  # plan validates as train does
            "--gin_param=AlgoConfig.micro_batch_size=8"]  # fmt: skip
    assert cli.main(argv) == 1  # does not fit
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["fits"] is False and out["workload"]["critic"] and out["workload"]["reference"]
    assert any(s["fits"] for s in out["suggestions"])
    # fsdp over 64 devices: the sampler holds a re-laid-out copy, which int8 shrinks
    (int8,) = [s for s in out["suggestions"] if s["change"] == 'RolloutConfig.weights="int8"']
    used = out["bytes_per_device"]
    assert used["rollout_weights"] > 0 and int8["peak"] <= used["peak"]  # train phase peaks
    assert cli.main(["plan", "--devices=8", "--device-memory-gb=16"]) == 0  # built-in default
    table = capsys.readouterr().out
    assert "fits" in table and "kv_cache" in table


def test_cli_plans_devices_set_apart_for_the_sampler(capsys):
    """The trainer's mesh is resolved over the devices the sampler's are not; both kinds of
    device are reported; a split that leaves the trainer nothing is one clean error."""
    split = ["plan", "--devices=8", "--json", "--gin_param=MeshConfig.rollout_devices=4"]
    assert cli.main(split) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["workload"]["rollout_devices"] == 4 and out["workload"]["sampler_mesh"] == [4, 1, 1]
    assert out["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}  # 8 - 4 devices
    assert out["bytes_per_sampler_device"]["kv_cache"] > 0
    assert out["bytes_per_device"]["kv_cache"] == 0
    assert cli.main(["plan", "--devices=4", "--gin_param=MeshConfig.rollout_devices=4"]) == 2
    assert "leaves none of the 4 devices" in capsys.readouterr().err


def test_cli_an_unknown_checkpoint_is_one_clean_error(capsys):
    argv = ["plan", "--devices=8", "--gin_param=PolicyConfig.checkpoint='/nowhere/model'"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "has no config.json here" in err and "--model" in err and "Traceback" not in err


def test_cli_an_int8_kv_cache_holds_about_a_quarter(capsys):
    """`RolloutConfig.kv_cache_dtype = "int8"` plans the pool at (H + 4) / 4H of float32's
    bytes (the int8 values and a float32 scale per head)."""
    pools = {}
    for kv in ("auto", "int8"):
        argv = ["plan", "--devices=1", "--json", f"--gin_param=RolloutConfig.kv_cache_dtype='{kv}'"]
        assert cli.main(argv) in (0, 1)
        pools[kv] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    kv_bytes = {k: p["bytes_per_device"]["kv_cache"] for k, p in pools.items()}
    H = 32  # the built-in model's head_dim
    assert kv_bytes["int8"] * 4 * H == kv_bytes["auto"] * (H + 4)
