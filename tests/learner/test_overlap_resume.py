"""`RolloutProducer.checkpoint` across stops and resumes: every prompt of the data order is
trained once, whatever the resumed run changes (a smaller `max_staleness`, fewer steps) and
when a step sampled ahead failed. What is checked is the order of the batches the trainer
takes (`take`), not the order they were sampled in."""

import jax.numpy as jnp
import pytest

from tests.learner.test_overlap import _Trainer


def _segment(k, last, stop, first=1, ready=None, drawn=0, fail_at=None):
    """Steps `first .. stop` of a run of `last` steps with `max_staleness = k`, resumed from
    a checkpoint's batches `ready` and data state `drawn` (the weights are those after
    `first - 1` updates), then a checkpoint after step `stop`: the prompts trained, in order,
    and the checkpoint's (data state, batches)."""
    t = _Trainer(k, steps=last, first=first, ready=ready, fail_at=fail_at)
    t.prompts.drawn = drawn
    t.producer.start({"w": jnp.full(2, first - 1)}, None)
    trained = []
    for step in range(first, stop + 1):
        trained.append(t.producer.take(step)[0].prompt_ids[0])
        t.publish(step)
    data, ahead = t.producer.checkpoint(stop)
    t.producer.close()
    return trained, data["drawn"], ahead


def _data_order(n):
    return [f"p{i}" for i in range(n)]


def test_a_smaller_bound_on_resume_keeps_the_batches_sampled_ahead():
    """Saved after step 1 with k = 3 (steps 2, 3, 4 sampled), resumed with k = 1: the
    checkpoint after step 2 holds steps 3 and 4, not only step 3 (which k = 1 alone would
    sample ahead); its data state is still the one before step 5's prompts."""
    first, drawn, ahead = _segment(3, last=6, stop=1)
    assert sorted(ahead) == [2, 3, 4] and drawn == 4
    second, drawn, ahead = _segment(1, last=6, stop=2, first=2, ready=ahead, drawn=drawn)
    assert sorted(ahead) == [3, 4] and drawn == 4
    third, *_ = _segment(1, last=6, stop=6, first=3, ready=ahead, drawn=drawn)
    assert first + second + third == _data_order(6)


def test_fewer_steps_on_resume_keeps_the_batches_sampled_beyond_them():
    """Saved after step 3 with k = 2 (steps 4, 5 sampled), resumed with `steps = 4`: the
    final checkpoint holds step 5's batch, whose prompts its data state has drawn, and a run
    extended from it to 7 steps trains it at step 5."""
    first, drawn, ahead = _segment(2, last=10, stop=3)
    assert sorted(ahead) == [4, 5] and drawn == 5
    second, drawn, ahead = _segment(2, last=4, stop=4, first=4, ready=ahead, drawn=drawn)
    assert sorted(ahead) == [5] and drawn == 5
    third, *_ = _segment(2, last=7, stop=7, first=5, ready=ahead, drawn=drawn)
    assert first + second + third == _data_order(7)


@pytest.mark.parametrize("fail_at", [2, 3])
def test_a_checkpoint_is_saved_when_a_step_it_waits_for_has_failed(fail_at):
    """k = 2: step `fail_at` (one of the two steps sampled ahead of a checkpoint after step
    1) fails. As the synchronous loop saves step 1 before sampling step 2, the checkpoint is
    saved, with the batches sampled before the failed step and the data state before its
    prompts; a validation goes ahead too. The trainer meets the error at that step's
    `take`. A run resumed from the checkpoint samples the failed step with the checkpoint's
    (newer) weights, and trains every prompt once."""
    t = _Trainer(2, steps=6, fail_at=fail_at)
    t.producer.start({"w": jnp.zeros(2)}, None)
    trained = [t.producer.take(1)[0].prompt_ids[0]]
    t.publish(1)
    t.producer._thread.join()  # the producer has failed on step `fail_at` and stopped
    data, ahead = t.producer.checkpoint(1)
    assert sorted(ahead) == list(range(2, fail_at)) and data == {"drawn": fail_at - 1}
    with t.producer.paused(1):
        pass
    for step in range(2, fail_at):
        assert t.producer.take(step)[0] is ahead[step][0]
    with pytest.raises(ValueError, match=f"reward failed at step {fail_at}"):
        t.producer.take(fail_at)
    t.producer.close()

    resumed, *_ = _segment(2, last=6, stop=6, first=2, ready=ahead, drawn=data["drawn"])
    assert trained + resumed == _data_order(6)
