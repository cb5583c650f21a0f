"""The Grain prompt pipeline: determinism, epochs, exact resume, sharding, filtering, padding."""

import json

import numpy as np
import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig


def config(path, **overrides):
    settings = dict(global_batch_size=4, num_epochs=3, seed=7, max_prompt_length=32)
    settings.update(overrides)
    return PipelineConfig(SourceConfig(str(path)), **settings)


def flat(batches):
    return [pid for batch in batches for pid in batch]


def id_batches(iterator):
    return [batch.ids for batch in iterator]


def test_same_seed_same_order_and_epochs_reshuffle(math_jsonl, char_tokenizer):
    pipe = build_prompt_pipeline(config(math_jsonl), char_tokenizer)
    assert pipe.steps_per_epoch == 5 and pipe.num_batches == 15  # 23 prompts // 4
    first = id_batches(pipe.iterator())
    again = id_batches(build_prompt_pipeline(config(math_jsonl), char_tokenizer).iterator())
    other = id_batches(build_prompt_pipeline(config(math_jsonl, seed=8), char_tokenizer).iterator())
    assert first == again
    assert first != other
    epochs = [flat(first[e * 5 : (e + 1) * 5]) for e in range(3)]
    for ids in epochs:
        assert len(ids) == len(set(ids)) == 20  # a drop-last epoch: 3 prompts left over
    assert epochs[0] != epochs[1]  # reshuffled every epoch


def test_unshuffled_order_is_the_file_order(math_jsonl, char_tokenizer):
    pipe = build_prompt_pipeline(config(math_jsonl, shuffle=False, num_epochs=1), char_tokenizer)
    assert flat(id_batches(pipe.iterator())) == [f"q{i:03d}" for i in range(20)]


def test_resume_mid_epoch_yields_the_identical_remaining_sequence(math_jsonl, char_tokenizer):
    full = id_batches(build_prompt_pipeline(config(math_jsonl), char_tokenizer).iterator())
    it = build_prompt_pipeline(config(math_jsonl), char_tokenizer).iterator()
    seen = [next(it) for _ in range(7)]  # epoch 1, two steps in
    assert (seen[-1].epoch, seen[-1].index) == (1, 6)
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
    rebuilt = build_prompt_pipeline(config(math_jsonl), char_tokenizer)
    resumed = rebuilt.iterator(state)
    rest = list(resumed)
    assert [b.ids for b in rest] == full[7:]
    assert [b.index for b in rest] == list(range(7, 15))
    assert id_batches(it) == full[7:]  # the original iterator agrees


def test_state_from_other_data_or_settings_is_refused(math_jsonl, char_tokenizer):
    state = build_prompt_pipeline(config(math_jsonl), char_tokenizer).iterator().get_state()
    other = build_prompt_pipeline(config(math_jsonl, seed=1), char_tokenizer)
    with pytest.raises(ValueError, match="different prompts or pipeline settings"):
        other.iterator(state)
    with pytest.raises(ValueError, match="not a prompt iterator state"):
        other.iterator({"next_index": 3})


def test_hosts_split_each_global_batch(math_jsonl, char_tokenizer):
    single = id_batches(build_prompt_pipeline(config(math_jsonl), char_tokenizer).iterator())
    hosts = [
        id_batches(
            build_prompt_pipeline(
                config(math_jsonl), char_tokenizer, process_index=h, process_count=2
            ).iterator()
        )
        for h in range(2)
    ]
    assert len(hosts[0]) == len(hosts[1]) == len(single)
    for step, global_ids in enumerate(single):
        a, b = hosts[0][step], hosts[1][step]
        assert len(a) == len(b) == 2 and not set(a) & set(b)
        assert sorted(a + b) == sorted(global_ids)
    with pytest.raises(ConfigError, match=r"DataConfig.prompts_per_step = 3 .* 2 hosts"):
        build_prompt_pipeline(
            config(math_jsonl, global_batch_size=3),
            char_tokenizer,
            process_index=0,
            process_count=2,
        )


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_grain_cannot_shuffle_with_is_a_config_error(math_jsonl, seed):
    with pytest.raises(
        ConfigError, match=rf"PipelineConfig.seed = {seed}: expected int \(>= 0 and < 4294967296\)"
    ):
        config(math_jsonl, seed=seed)


def test_long_prompts_are_filtered_counted_and_logged(tmp_path, char_tokenizer, caplog):
    rows = [{"id": f"p{i}", "prompt": "x" * (10 + i), "answer": "1"} for i in range(8)]
    path = tmp_path / "lens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        pipe = build_prompt_pipeline(
            config(path, max_prompt_length=13, shuffle=False, num_epochs=1), char_tokenizer
        )
    assert pipe.report.too_long == ["p4", "p5", "p6", "p7"]
    assert pipe.report.kept == 4 and pipe.report.as_metrics()["data/filtered_too_long"] == 4
    assert "filtered 4 of 8 prompts longer than 13 tokens" in caplog.text
    batch = next(pipe.iterator())
    assert batch.input_ids.shape == (4, 13) and batch.input_ids.dtype == np.int32
    np.testing.assert_array_equal(batch.prompt_lengths, [10, 11, 12, 13])
    pad = char_tokenizer.pad_token_id
    assert batch.input_ids[0, 10:].tolist() == [pad] * 3
    assert char_tokenizer.decode(batch.input_ids[1, :11]).replace(" ", "") == "x" * 11


def test_batch_carries_answers_texts_and_passthrough(math_jsonl, char_tokenizer):
    pipe = build_prompt_pipeline(
        config(math_jsonl, template="search_r1", max_prompt_length=600, shuffle=False),
        char_tokenizer,
    )
    batch = next(pipe.iterator())
    assert (
        batch.ids[0] == "q000" and batch.answers[0] == "0" and batch.prompts[0] == "What is 0 + 0?"
    )
    assert batch.texts[0].endswith("Question: What is 0 + 0?\n")
    assert batch.examples[0]["source"] == "t" and len(batch) == 4


def test_eval_pipeline_keeps_the_last_partial_batch(math_jsonl, char_tokenizer):
    pipe = build_prompt_pipeline(
        config(math_jsonl, shuffle=False, num_epochs=1, drop_remainder=False), char_tokenizer
    )
    sizes = [len(b) for b in pipe.iterator()]
    assert sizes == [4, 4, 4, 4, 4, 3]
    with pytest.raises(ValueError, match="drop_remainder=False"):
        build_prompt_pipeline(config(math_jsonl, drop_remainder=False), char_tokenizer)


def test_too_few_prompts_for_a_batch_fails_clearly(math_jsonl, char_tokenizer):
    with pytest.raises(ValueError, match="fewer than one global batch"):
        build_prompt_pipeline(config(math_jsonl, global_batch_size=64), char_tokenizer)


def test_malformed_rows_do_not_stop_the_pipeline(tmp_path, char_tokenizer):
    lines = ['{"id": "a", "prompt": "p", "answer": "1"}', "{oops", '{"id": "b", "prompt": "q"}']
    lines += [json.dumps({"id": f"c{i}", "prompt": "r", "answer": "2"}) for i in range(3)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    pipe = build_prompt_pipeline(config(path, global_batch_size=2, num_epochs=2), char_tokenizer)
    assert [(b.line, b.reason[:12]) for b in pipe.report.malformed] == [
        (2, "invalid JSON"),
        (3, "no answer fi"),
    ]
    assert sum(len(b) for b in pipe.iterator()) == 8


def test_repeating_forever_keeps_counting_epochs(math_jsonl, char_tokenizer):
    pipe = build_prompt_pipeline(
        config(math_jsonl, num_epochs=None), char_tokenizer, process_index=1, process_count=2
    )
    assert pipe.num_batches is None
    it = pipe.iterator()
    batches = [next(it) for _ in range(12)]
    assert [b.epoch for b in batches] == [0] * 5 + [1] * 5 + [2] * 2
    assert it.get_state()["grain"] == {"next_index": 12}
