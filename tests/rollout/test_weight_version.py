"""The sampler checks the policy version of the weights it received (issue #29, item 4).

A push carries its version in the same transfer as the weights (with LoRA, as the
adapters), and `RolloutStage.generate(..., version=v)` refuses to sample unless the sampler
holds v: an adapter update lost on the way, a skipped sync, or weights released are caught
before any sampling. Each layout the JAX sampler syncs into: the trainer's own arrays (a
pointer), a cast on the same devices, and devices apart (`MeshConfig.rollout_devices`);
and the overlapped producer's copies (`learner/overlap.py`), each bound to its version.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.learner.overlap import RolloutProducer
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.models.lora import LoraConfig, apply_lora, split_adapters
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.sampler import PolicyWeights, StaleWeightsError, check_version
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.sharding.mesh import build_mesh
from jaxrl_llm.types import Completion, Rollout

LAYOUTS = ["pointer", "cast", "apart"]


def _stage(layout: str) -> tuple[RolloutStage, nnx.State]:
    """A rollout stage over the shipped model with LoRA adapters, on 4 of the simulated
    devices, and the policy's State (the trainer's layout)."""
    devices = jax.devices()
    train = build_mesh(fsdp=4, devices=devices[:4])
    apart = build_mesh(data=4, fsdp=1, devices=devices[4:]) if layout == "apart" else None
    path = builtin_checkpoint()
    policy = from_pretrained(path, mesh=train)
    apply_lora(policy, LoraConfig(rank=2, alpha=4.0), seed=0)
    stage = RolloutStage(
        RolloutConfig(max_new_tokens=4, max_slots=2, n=2), policy, load_tokenizer(path), train,
        max_prompt_length=16, seed=0, rollout_dtype="bfloat16" if layout == "cast" else None,
        sampling_mesh=apart,
    )  # fmt: skip
    return stage, nnx.state(policy)


def _trained(state: nnx.State, value: float) -> nnx.State:
    """`state` with every adapter set to `value` (another version of the trained params)."""
    adapters, base = split_adapters(state)
    return nnx.merge_state(jax.tree.map(lambda x: jnp.full_like(x, value), adapters), base)


def _held_adapters(stage: RolloutStage) -> list[np.ndarray]:
    sampler = stage.sampler
    assert isinstance(sampler, JaxSampler)
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(split_adapters(sampler.params)[0])]


class _LoseUpdates:
    """An adapter sync that runs, but whose first result is all it ever returns."""

    def __init__(self, real):
        self.real, self.kept = real, []

    def stage(self, tree):
        self.kept.append(self.real.stage(tree))
        return self.kept[0]

    def local(self, glob):
        return self.real.local(glob)


def _lose_adapter_updates(stage: RolloutStage, monkeypatch) -> None:
    sync = stage.sampler._sync  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setattr(sync, "_adapters", _LoseUpdates(sync._adapters))


class _Length:
    """A reward: the response's length (any scorer with `score(responses, examples)`)."""

    def score(self, responses, examples):
        return [float(len(r)) for r in responses]


def _batch(tokenizer) -> PromptBatch:
    ids = np.asarray(tokenizer("What is 3 + 4?")["input_ids"], np.int32)
    return PromptBatch(ids=["p0"], prompts=["q"], answers=["7"], texts=["q"],
                       input_ids=ids[None], prompt_lengths=np.asarray([len(ids)], np.int32),
                       examples=[{"answer": "7"}], index=0, epoch=0)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_lost_adapter_update_stops_sampling_naming_both_versions(layout, monkeypatch):
    """The adapters' sync loses every update after the first: the sampler still holds
    version 1 when step 2 asks for version 2, and refuses before sampling."""
    stage, state = _stage(layout)
    _lose_adapter_updates(stage, monkeypatch)
    stage.sync_weights(PolicyWeights(_trained(state, 0.25), 1))
    stage.sync_weights(PolicyWeights(_trained(state, 0.5), 2))
    assert all((x == 0.25).all() for x in _held_adapters(stage))  # what it would sample with
    with pytest.raises(StaleWeightsError, match=r"holds the weights of version 1.*version 2"):
        stage.generate(None, step=2, attempt=1, reward=None, version=2)
    stage.close()


def test_a_skipped_or_released_sync_stops_sampling():
    stage, state = _stage("pointer")
    stage.sync_weights(PolicyWeights(state, 3))
    with pytest.raises(StaleWeightsError, match=r"holds the weights of version 3.*version 4"):
        stage.generate(None, step=4, attempt=1, reward=None, version=4)
    stage.release_weights()
    with pytest.raises(StaleWeightsError, match=r"holds no versioned weights.*version 3"):
        stage.generate(None, step=3, attempt=1, reward=None, version=3)
    stage.sync_weights(state)  # a push without a version (validation, eval) checks nothing
    assert stage.sampler.policy_version is None
    stage.close()


@pytest.mark.slow  # 14 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_push_delivers_its_version_with_the_adapters(layout):
    """Each push's version arrives with its adapters (only the adapters move after the
    first), pushed at once or staged first (`RolloutStage.stage_weights`)."""
    stage, state = _stage(layout)
    first = stage.sync_weights(PolicyWeights(_trained(state, 0.25), 1))
    second = stage.sync_weights(PolicyWeights(_trained(state, 0.5), 2))
    assert stage.sampler.policy_version == 2
    assert all((x == 0.5).all() for x in _held_adapters(stage))  # the new adapters arrived
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(split_adapters(state)[0]))
    assert second.bytes == adapter_bytes < first.bytes  # the version adds no bytes
    if layout == "apart":  # the checked weights sample (one layout: each compiles the engine)
        batch, reward = _batch(stage.tokenizer), _Length()
        got = stage.generate(batch, step=2, attempt=1, reward=reward, version=2)
        assert got.policy_version == 2 and len(got.completions) == 2
    # Staged on one thread, pushed later (a multi-host overlapped run's hand-over): the
    # same delivery, and a staged copy pushed as another version is refused.
    staged = stage.stage_weights(PolicyWeights(_trained(state, 0.75), 3))
    assert stage.sampler.policy_version == 2  # staging delivers nothing yet
    third = stage.sync_weights(staged)
    assert stage.sampler.policy_version == 3 and third.bytes == adapter_bytes
    assert all((x == 0.75).all() for x in _held_adapters(stage))
    with pytest.raises(ValueError, match="staged as version 3 pushed as 4"):
        stage.sync_weights(PolicyWeights(staged.params, 4))
    assert stage.sampler.policy_version == 3  # the refused push changed nothing
    stage.close()


class _Prompts:
    """A data iterator with nothing to record."""

    def get_state(self):
        return {}


def _rollout(version: int) -> Rollout:
    one = lambda dtype: np.ones(1, dtype)
    c = Completion(0, 0, one(np.int32), one(np.int32), one(np.float32), None, one(np.int32),
                   "stop", "x")  # fmt: skip
    return Rollout((c,), (None,), ("p",), np.zeros(1, np.float32), 1, version)


@pytest.mark.parametrize("staged", [False, True])
def test_the_producer_stops_at_the_first_step_whose_adapters_were_lost(staged, monkeypatch):
    """`max_staleness = 1`: steps 1 and 2 sample with version 1 (the start's weights), step
    3 with version 2 (after update 1). The adapters' sync keeps returning version 1's, so
    step 3's batch is refused before sampling, and the trainer gets the error at its take;
    the same when the producer's weights are staged by `publish` (several processes)."""
    stage, state = _stage("cast")
    _lose_adapter_updates(stage, monkeypatch)
    adapters, base = split_adapters(state)
    trained = lambda v: jax.tree.map(lambda x: jnp.full_like(x, v), adapters)
    sampled = []

    def collect(step, weights, version, refresh):
        stage.sync_weights(weights)
        check_version(stage.sampler.policy_version, version)  # `generate`'s check, first
        sampled.append((step, version))
        return _rollout(version), {"timing/weight_sync": 0.0}

    stager = stage.stage_weights if staged else None
    producer = RolloutProducer(collect, _Prompts(), first=1, last=4, k=1, stage=stager)
    producer.start(trained(0.25), base)
    assert producer.take(1)[0].policy_version == 1
    producer.publish(1, trained(0.5), base)
    assert producer.take(2)[0].policy_version == 1
    with pytest.raises(StaleWeightsError, match=r"holds the weights of version 1.*version 2"):
        producer.take(3)
    producer.close()
    stage.close()
    assert sampled == [(1, 1), (2, 1)]
