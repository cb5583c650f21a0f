"""`RolloutProducer` on its own: the staleness bound, what a checkpoint records (the batches
sampled ahead, the data state), errors and stopping (the loop end to end:
tests/learner/test_rl_loop.py)."""

import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.learner.overlap import RolloutProducer, staleness_metrics
from jaxrl_llm.types import Completion, Rollout


class _Prompts:
    """A data iterator whose state is the number of batches drawn."""

    def __init__(self):
        self.drawn = 0

    def get_state(self):
        return {"drawn": self.drawn}


def _rollout(version: int, prompt: str = "p") -> Rollout:
    one = lambda dtype: np.ones(1, dtype)
    c = Completion(0, 0, one(np.int32), one(np.int32), one(np.float32), None, one(np.int32),
                   "stop", "x")  # fmt: skip
    return Rollout((c,), (None,), (prompt,), np.zeros(1, np.float32), 1, version)


class _Trainer:
    """Drives a producer as the loop does; `collect` records what it was given."""

    def __init__(
        self, k: int, steps: int, first: int = 1, fail_at: int | None = None, ready=None,
        partial: bool = False,
    ):  # fmt: skip
        self.prompts, self.seen, self.published = _Prompts(), [], first - 1
        self.fail_at = fail_at
        self.producer = RolloutProducer(
            self.collect, self.prompts, first=first, last=steps, k=k, ready=ready,
            partial=partial,
        )  # fmt: skip

    def collect(self, step, params, version, refresh):
        assert refresh is None  # partial rollouts off
        if step == self.fail_at:
            raise ValueError(f"reward failed at step {step}")
        assert params.version == version  # each copy is bound to its version when published
        self.seen.append((step, int(params.params["w"][0]), version, self.published))
        self.prompts.drawn += 1  # the batch is named for its place in the data order
        return _rollout(version, f"p{self.prompts.drawn - 1}"), {"timing/weight_sync": 0.0}

    def publish(self, updates):
        self.published = updates
        self.producer.publish(updates, {"w": jnp.full(2, updates)}, None)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_step_samples_with_the_weights_exactly_k_updates_behind(k):
    t = _Trainer(k, steps=7)
    t.producer.start({"w": jnp.zeros(2)}, None)
    for step in range(1, 8):
        samples, metrics = t.producer.take(step)
        assert samples.policy_version == max(1, step - k)  # staleness min(k, step - 1)
        assert metrics["timing/rollout_wait"] >= 0 and metrics["timing/sampler_wait"] >= 0
        assert "timing/rollout" in metrics
        t.publish(step)
    t.producer.close()
    assert [s for s, *_ in t.seen] == list(range(1, 8))  # in order, each once
    for step, weights, version, published in t.seen:
        assert weights == version - 1 == max(0, step - 1 - k)  # the copy of that version
        assert published - weights <= k  # never ran ahead of the bound


def test_a_resumed_producer_starts_from_the_resumed_weights():
    t = _Trainer(2, steps=6, first=4)  # resumed after 3 updates
    t.producer.start({"w": jnp.full(2, 3)}, None)
    versions = []
    for step in range(4, 7):
        versions.append(t.producer.take(step)[0].policy_version)
        t.publish(step)
    t.producer.close()
    assert versions == [4, 4, 4]  # the weights after 3 updates, until step 7 would move on


def test_a_checkpoint_saves_the_batches_sampled_with_older_weights():
    """k = 2, checkpoint after update 1: steps 2 and 3 sample with the initial weights, which
    the checkpoint does not hold, so it waits for them and saves them; the data state is the
    one before step 4's prompts. A producer resumed from it hands them out first and samples
    step 4 on with the checkpoint's weights, as the uninterrupted producer does."""
    t = _Trainer(2, steps=6)
    t.producer.start({"w": jnp.zeros(2)}, None)
    t.producer.take(1)
    t.publish(1)
    data, ahead = t.producer.checkpoint(1)
    assert data == {"drawn": 3}  # step 4's prompts come next
    assert {s: b[0].policy_version for s, b in ahead.items()} == {2: 1, 3: 1}
    for step in range(2, 7):
        t.producer.take(step)
        t.publish(step)
    assert t.producer.checkpoint(6) == ({"drawn": 6}, {})  # the last step: nothing ahead
    t.producer.close()

    r = _Trainer(2, steps=6, first=2, ready=ahead)
    r.prompts.drawn = 3
    r.producer.start({"w": jnp.ones(2)}, None)  # the checkpoint's weights (1 update)
    assert [r.producer.take(s)[0] for s in (2, 3)] == [ahead[2][0], ahead[3][0]]
    r.publish(2), r.publish(3)
    for step in range(4, 7):
        r.producer.take(step)
        r.publish(step)
    r.producer.close()
    # Sampled after the saved batches only, each with the uninterrupted run's weights.
    assert [(s, w) for s, w, *_ in r.seen] == [(s, w) for s, w, *_ in t.seen[3:]]
    with pytest.raises(ValueError, match=r"steps \[3\] do not follow step 1"):
        RolloutProducer(r.collect, r.prompts, first=2, last=6, k=2, ready={3: ahead[3]})


def test_a_validation_comes_between_the_same_two_batches_every_time():
    """A validation after step s's update (`paused`, the weights published after it) runs
    once the batch of step s + k is sampled and before step s + k + 1 begins, however slow
    the producer: the same point on every host of a multi-host run."""
    t = _Trainer(2, steps=6)
    slow = t.collect
    t.collect = lambda *a: (time.sleep(0.05), slow(*a))[1]
    t.producer._collect = t.collect  # pyright: ignore[reportAttributeAccessIssue]
    t.producer.start({"w": jnp.zeros(2)}, None)
    t.producer.take(1)
    with t.producer.paused(1):  # validating with the weights after update 1
        assert [step for step, *_ in t.seen] == [1, 2, 3]
        time.sleep(0.1)
        assert len(t.seen) == 3  # step 4 needs update 1's weights, not yet published
    t.publish(1)
    for step in range(2, 7):
        t.producer.take(step)
        with t.producer.paused(step):
            assert [s for s, *_ in t.seen] == list(range(1, min(step + 2, 6) + 1))
        t.publish(step)
    t.producer.close()


def test_an_error_while_sampling_reaches_the_trainer_as_itself():
    t = _Trainer(1, steps=4, fail_at=2)
    t.producer.start({"w": jnp.zeros(2)}, None)
    t.producer.take(1)
    with pytest.raises(ValueError, match="reward failed at step 2"):
        t.producer.take(2)
    t.producer.close()


def test_a_checkpoint_is_saved_when_a_later_step_has_failed():
    """k = 1: step 2's batch is sampled; once update 1 is published the producer samples
    step 3, whose reward fails. A checkpoint after step 1 has all it needs (step 2's batch,
    the data state before step 3's prompts) and is saved, as the synchronous loop saves step
    1 before step 2's sampling fails; so does a validation. The error comes at step 3's
    `take`."""
    t = _Trainer(1, steps=5, fail_at=3)
    t.producer.start({"w": jnp.zeros(2)}, None)
    t.producer.take(1)
    t.publish(1)
    t.producer._thread.join()  # the producer has failed on step 3 and stopped
    data, ahead = t.producer.checkpoint(1)
    assert data == {"drawn": 2}  # step 3's prompts come next
    assert {s: b[0].policy_version for s, b in ahead.items()} == {2: 1}
    with t.producer.paused(1):
        pass
    assert t.producer.take(2)[0] is ahead[2][0]
    with pytest.raises(ValueError, match="reward failed at step 3"):
        t.producer.take(3)
    t.producer.close()


def test_close_stops_a_producer_waiting_for_weights():
    t = _Trainer(1, steps=5)
    t.producer.start({"w": jnp.zeros(2)}, None)
    t.producer.take(1)
    t.producer.close()  # it waits for update 1, never published: close must not hang
    assert [s for s, *_ in t.seen] == [1, 2]


class _Partial(_Trainer):
    """Partial rollouts: step 2's sampling waits until update 1 is published, then asks for
    newer weights twice; every step records the versions it sampled with."""

    def __init__(self, k: int, steps: int):
        super().__init__(k, steps, partial=True)
        self.update_1 = threading.Event()
        self.versions: dict[int, list[int]] = {}

    def collect(self, step, params, version, refresh):
        assert refresh is not None and params.version == version
        self.versions[step] = [version]
        if step == 2:
            self.update_1.wait(timeout=30)
            newer, deadline = refresh(), time.monotonic() + 30
            while newer is None and time.monotonic() < deadline:  # until its copy is computed
                time.sleep(0.01)
                newer = refresh()
            assert newer is not None and int(newer.params["w"][0]) == newer.version - 1
            self.versions[step].append(newer.version)
            assert refresh() is None  # nothing newer since
        self.prompts.drawn += 1
        return _rollout(version), {"timing/weight_sync": 0.0}

    def publish(self, updates):
        super().publish(updates)
        if updates == 1:
            self.update_1.set()


def test_partial_rollouts_continue_with_the_newest_weights_within_the_bound():
    """k = 2: step 2 begins with the initial weights and takes the weights after update 1
    mid-sample; step 3 begins with those (newest), not the initial ones the bound allows;
    every step's versions rise and stay within the bound and the updates so far."""
    t = _Partial(2, steps=6)
    t.producer.start({"w": jnp.zeros(2)}, None)
    for step in range(1, 7):
        t.producer.take(step)
        t.publish(step)
    t.producer.close()
    assert t.versions[1] == [1] and t.versions[2] == [1, 2] and t.versions[3][0] >= 2
    for step, versions in t.versions.items():
        assert versions == sorted(versions)
        assert max(1, step - 2) <= versions[0] and versions[-1] <= step  # the bound; no future
    assert sorted(t.versions) == list(range(1, 7))


def test_weights_not_yet_computed_are_not_handed_over(monkeypatch):
    """A copy is published when its update is dispatched; until it is computed, a sample does
    not swap to it (the push would wait for the update) and a step starts with the newest
    computed weights the bound allows."""
    from jaxrl_llm.learner import overlap

    computed = {1}
    monkeypatch.setattr(overlap, "_computed", lambda w: w.version in computed)
    seen, done = {}, threading.Event()

    def collect(step, params, version, refresh):
        if step == 2:
            done.wait(timeout=30)
        newer = refresh()
        seen[step] = (version, None if newer is None else newer.version)
        return _rollout(version), {"timing/weight_sync": 0.0}

    producer = RolloutProducer(collect, _Prompts(), first=1, last=3, k=2, partial=True)
    producer.publish(0, {"w": jnp.zeros(2)}, None)
    producer.publish(1, {"w": jnp.ones(2)}, None)  # version 2, "still computing"
    producer._thread.start()
    producer.take(1)
    assert seen[1] == (1, None)  # began with version 1 and was not handed version 2
    computed.add(2)
    done.set()
    producer.take(2)
    assert 2 in seen[2]  # computed now: begun with or swapped to
    producer.close()


def test_staleness_is_measured_per_trained_token_with_tags():
    """Without tags every token lags alike; with them, per trained token (a tool's tokens,
    mask 0, do not count), and the share of samples that span two versions."""
    plain = _rollout(3)
    assert staleness_metrics(plain, 5) == {"rollout/staleness/mean": 2.0,
                                           "rollout/staleness/max": 2.0}  # fmt: skip
    ids = np.arange(4, dtype=np.int32)
    tagged = Completion(0, 0, ids, ids, np.zeros(4, np.float32), None,
                        np.asarray([1, 1, 0, 1], np.int32), "stop", "x",
                        token_versions=np.asarray([3, 4, 2, 4], np.int32))  # fmt: skip
    whole = Completion(0, 1, ids, ids, np.zeros(4, np.float32), None, np.ones(4, np.int32),
                       "stop", "y", token_versions=np.full(4, 4, np.int32))  # fmt: skip
    batch = Rollout((tagged, whole), (None, None), ("p",), np.zeros(2, np.float32), 2, 3)
    m = staleness_metrics(batch, 5)
    assert m["rollout/staleness/max"] == 2.0  # the one version-3 token; the tool's 2 ignored
    assert m["rollout/staleness/mean"] == pytest.approx((2 + 1 + 1 + 4 * 1) / 7)
    assert m["rollout/partial_frac"] == 0.5


def test_a_producer_refuses_k_zero():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        RolloutProducer(lambda *a: None, _Prompts(), first=1, last=2, k=0)  # pyright: ignore


def test_rollout_devices_split_the_devices_or_say_why_not():
    from jaxrl_llm.config_checks import ConfigError
    from jaxrl_llm.learner.rl_config import MeshConfig
    from jaxrl_llm.learner.run import _meshes

    assert _meshes(MeshConfig())[1] is None  # the sampler on the trainer's devices
    train, sample = _meshes(MeshConfig(tensor=2, rollout_devices=2))
    assert sample is not None
    assert dict(train.shape) == {"data": 1, "fsdp": 3, "tensor": 2}  # 6 devices
    assert dict(sample.shape) == {"data": 1, "fsdp": 1, "tensor": 2}
    assert not set(train.devices.flat) & set(sample.devices.flat)
    _, wide = _meshes(MeshConfig(tensor=2, rollout_devices=6))
    assert wide is not None and dict(wide.shape) == {"data": 3, "fsdp": 1, "tensor": 2}
    _, four = _meshes(MeshConfig(tensor=4, rollout_devices=4, data=-1, fsdp=1))
    assert four is not None and dict(four.shape) == {"data": 1, "fsdp": 1, "tensor": 4}
    with pytest.raises(ConfigError, match="rollout_devices = 8 needs more devices"):
        _meshes(MeshConfig(rollout_devices=8))


def test_multi_process_runs_refuse_the_one_process_settings(monkeypatch):
    import jax

    from jaxrl_llm.config_checks import ConfigError
    from jaxrl_llm.learner.rl_config import MeshConfig, RLConfig
    from jaxrl_llm.learner.run import _check_one_process

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    _check_one_process(RLConfig())  # the defaults run on any number of processes
    _check_one_process(RLConfig(max_staleness=1))  # overlap: tests/integration/test_multihost
    with pytest.raises(ConfigError, match=r"MeshConfig.rollout_devices = 2 runs on one"):
        _check_one_process(RLConfig(mesh=MeshConfig(rollout_devices=2)))


def test_a_multi_process_overlap_needs_a_sampler_that_stages_its_push(monkeypatch):
    """Several processes: the producer's push must run no cross-host collective, so the
    weights are staged on the trainer's thread; a sampler without `stage_weights` (vLLM, a
    plug-in) is refused with the fix named, before any step."""
    import types

    import jax

    from jaxrl_llm.config_checks import ConfigError
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.learner.rl_loop import _producer
    from jaxrl_llm.rollout.config import RolloutConfig

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    cfg = RLConfig(max_staleness=1, steps=3, rollout=RolloutConfig(backend="vllm"))
    rollout = types.SimpleNamespace(stages_weights=False)
    run = types.SimpleNamespace(cfg=cfg, rollout=rollout)
    with pytest.raises(ConfigError, match=r"max_staleness = 1 on 2 processes needs a sampler"):
        _producer(run)  # pyright: ignore[reportArgumentType]
    staged = []
    rollout = types.SimpleNamespace(stages_weights=True, stage_weights=staged.append,
                                    exchange_by_tag=False)  # fmt: skip
    learner = types.SimpleNamespace(state=types.SimpleNamespace(step=0))
    run = types.SimpleNamespace(cfg=cfg, rollout=rollout, learner=learner, prompts=None,
                                ahead={}, reward=None)  # fmt: skip
    producer = _producer(run)  # pyright: ignore[reportArgumentType]
    assert producer is not None
    assert rollout.exchange_by_tag  # its gathers of the hosts' samples: no device program
    producer.publish(0, {"w": jax.numpy.ones(2)}, None)  # the trainer's thread stages it
    assert [w.version for w in staged] == [1]


def test_partial_rollouts_need_an_overlapped_run_and_a_backend_that_swaps():
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.rollout.config import RolloutConfig

    for backend in ("jax", "vllm"):
        partial = RLConfig(max_staleness=1, partial_rollouts=True,
                           rollout=RolloutConfig(backend=backend))  # fmt: skip
        partial.validate()
    with pytest.raises(ValueError, match=r"partial_rollouts needs RLConfig.max_staleness >= 1"):
        RLConfig(partial_rollouts=True).validate()
    plugin = RolloutConfig(backend="my_pkg.sampler:build")  # its abilities are not known
    with pytest.raises(ValueError, match=r"backend = 'my_pkg.sampler:build' does not continue"):
        RLConfig(max_staleness=1, partial_rollouts=True, rollout=plugin).validate()


def test_no_weights_are_copied_once_the_last_step_is_sampled(monkeypatch):
    """With partial rollouts the last step may swap to any update before it, so each of the
    last k updates was copied for the producer, also after that step was sampled, when no
    sample can take them: a copy of the whole policy (on device) for nothing. Once it is
    sampled, a publish copies nothing and the copies still held are dropped."""
    from jaxrl_llm.learner import overlap

    copies = []
    real_copy = overlap._copy
    monkeypatch.setattr(overlap, "_copy", lambda x: copies.append(1) or real_copy(x))
    t = _Partial(2, steps=4)
    t.producer.start({"w": jnp.zeros(2)}, None)
    for step in range(1, 5):
        t.producer.take(step)
        t.publish(step)
    t.producer.close()  # the producer's thread has ended: step 4 is sampled
    before = len(copies)
    t.publish(3)  # an update the last step could have swapped to while it was sampled
    assert len(copies) == before and not any(t.producer.needs(u) for u in range(4))
    assert t.producer._weights == {}  # nothing held for a sample that cannot come
