"""Each epoch's shuffle: epoch 0 is Grain's `MapDataset.shuffle(seed)` order exactly (runs,
tests and checkpoints within the first epoch are those of before), later epochs are seeded
by a hash of (seed, epoch), so neighbouring `DataConfig.seed` values share no epoch (Grain's
own reseeding, seed + epoch, gave seed s + 1's first epoch to seed s's second). Resume stays
exact across an epoch boundary, and a state saved past the first epoch under the old order
is refused in one line."""

import json

import grain
import pytest

from jaxrl_llm.data.epoch_order import epoch_seed
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig


def _pipeline(path, tokenizer, seed=7, num_epochs=3, **kw):
    config = PipelineConfig(SourceConfig(str(path)), global_batch_size=4, num_epochs=num_epochs,
                            seed=seed, max_prompt_length=32)  # fmt: skip
    return build_prompt_pipeline(config, tokenizer, **kw)


def _epochs(pipe, n_epochs):
    ids = [pid for _, batch in zip(range(n_epochs * 5), pipe.iterator()) for pid in batch.ids]
    return [ids[e * 20 : (e + 1) * 20] for e in range(n_epochs)]  # 23 prompts: 5 batches of 4


def test_the_first_epoch_is_grains_shuffle_of_the_seed(math_jsonl, char_tokenizer):
    for seed in (0, 7, 2**32 - 1):
        pipe = _pipeline(math_jsonl, char_tokenizer, seed=seed)
        grains = grain.MapDataset.source(pipe.prompts).shuffle(seed=seed)
        assert _epochs(pipe, 1)[0] == [grains[i].example["id"] for i in range(20)]


def test_neighbouring_seeds_share_no_epoch(math_jsonl, char_tokenizer):
    orders = {}
    for seed in range(5):
        for epoch, ids in enumerate(_epochs(_pipeline(math_jsonl, char_tokenizer, seed), 3)):
            assert len(set(ids)) == 20
            orders[seed, epoch] = tuple(ids)
    assert orders[0, 1] != orders[1, 0] and orders[0, 2] != orders[1, 1]
    assert len(set(orders.values())) == len(orders)  # 15 different orders


def test_epoch_seeds_do_not_collide_over_small_seeds_and_epochs():
    seeds = {epoch_seed(s, e) for s in range(256) for e in range(256)}
    assert len(seeds) == 256 * 256
    assert all(0 <= s < 2**32 for s in seeds)
    assert [epoch_seed(s, 0) for s in (0, 5, 2**32 - 1)] == [0, 5, 2**32 - 1]


@pytest.mark.parametrize("hosts", [1, 2])
def test_resume_at_every_batch_across_epoch_boundaries_is_exact(math_jsonl, char_tokenizer,
                                                                hosts):  # fmt: skip
    for host in range(hosts):
        kw = dict(num_epochs=None, process_index=host, process_count=hosts)
        full = [b.ids for _, b in zip(range(12), _pipeline(math_jsonl, char_tokenizer, **kw)
                                      .iterator())]  # fmt: skip
        for k in range(12):
            it = _pipeline(math_jsonl, char_tokenizer, **kw).iterator()
            for _ in range(k):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
            resumed = _pipeline(math_jsonl, char_tokenizer, **kw).iterator(state)
            assert [next(resumed).ids for _ in range(12 - k)] == full[k:], (host, k)


def _old_state(pipe, batches):
    """A state as the version that shuffled epoch e with seed + e saved it."""
    it = pipe.iterator()
    for _ in range(batches):
        next(it)
    state = it.get_state()
    del state["order_version"]
    return state


def test_an_old_order_state_within_the_first_epoch_resumes(math_jsonl, char_tokenizer):
    pipe = _pipeline(math_jsonl, char_tokenizer, num_epochs=None)
    full = [b.ids for _, b in zip(range(8), pipe.iterator())]
    for k in (0, 3, 5):  # 5: the first epoch done, none of the second drawn
        resumed = pipe.iterator(_old_state(pipe, k))
        assert [next(resumed).ids for _ in range(8 - k)] == full[k:]


def test_an_old_order_state_past_the_first_epoch_is_refused(math_jsonl, char_tokenizer):
    pipe = _pipeline(math_jsonl, char_tokenizer, num_epochs=None)
    with pytest.raises(ValueError, match=r"saved 6 batches in, past the first epoch \(5 batches\)"):
        pipe.iterator(_old_state(pipe, 6))
    unshuffled = build_prompt_pipeline(
        PipelineConfig(SourceConfig(str(math_jsonl)), global_batch_size=4, num_epochs=None,
                       shuffle=False, max_prompt_length=32), char_tokenizer,
    )  # fmt: skip
    resumed = unshuffled.iterator(_old_state(unshuffled, 6))  # the same order in every version
    assert next(resumed).ids == ["q004", "q005", "q006", "q007"]
