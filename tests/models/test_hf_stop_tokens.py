"""Stop tokens of an HF folder: config.json's eos, generation_config.json's eos_token_id and
the chat template's end-of-turn token, as one union that the rollout engine stops on."""

import json
import re

import numpy as np
import pytest
from transformers import GenerationConfig

from jaxrl_llm.assets.build import char_tokenizer
from jaxrl_llm.models import CheckpointError, ModelConfig, from_pretrained, init_model
from jaxrl_llm.models import save_pretrained as save

# char_tokenizer(): <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2, then bytes.
ENDOFTEXT, IM_END = 0, 2


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _folder(tmp_path, tokenizer, *, generation=None, template=True):
    """A tiny Qwen2 folder whose config.json eos is <|endoftext|> (as base models have)."""
    cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                      num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=ENDOFTEXT)  # fmt: skip
    tok = tokenizer if template else None
    save(init_model(cfg, seed=0), tmp_path, tokenizer=tok)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_union_of_config_generation_config_and_chat_template(tmp_path, tokenizer):
    path = _folder(tmp_path, tokenizer, generation={"eos_token_id": [ENDOFTEXT, 7]})
    cfg = from_pretrained(path).config
    assert cfg.eos_token_id == ENDOFTEXT  # config.json's value, unchanged
    assert cfg.eos_token_ids == (ENDOFTEXT, 7, IM_END)


def test_generation_config_int_and_no_side_files(tmp_path, tokenizer):
    bare = _folder(tmp_path / "bare", tokenizer, template=False)
    assert from_pretrained(bare).config.eos_token_ids == (ENDOFTEXT,)
    single = _folder(tmp_path / "int", tokenizer, generation={"eos_token_id": 9}, template=False)
    assert from_pretrained(single).config.eos_token_ids == (ENDOFTEXT, 9)


def test_llama3_style_template_stops_on_eot_id(tmp_path):
    """A tokenizer_config.json template (no .jinja file) and added_tokens_decoder ids."""
    path = _folder(tmp_path, char_tokenizer(), template=False)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}",
        "added_tokens_decoder": {"12": {"content": "<|eot_id|>"}, "13": {"content": "<|x|>"}},
    }))  # fmt: skip
    assert from_pretrained(path).config.eos_token_ids == (ENDOFTEXT, 12)


def test_save_pretrained_writes_generation_config(tmp_path, tokenizer):
    src = _folder(tmp_path / "src", tokenizer, generation={"eos_token_id": [7]})
    model = from_pretrained(src)
    save(model, tmp_path / "out")  # no tokenizer: the ids must survive through the file
    assert GenerationConfig.from_pretrained(tmp_path / "out").eos_token_id == [0, 7, 2]
    assert from_pretrained(tmp_path / "out").config == model.config


def test_bad_generation_config_is_a_clear_error(tmp_path, tokenizer):
    path = _folder(tmp_path, tokenizer)
    (path / "generation_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"generation_config\.json.* is not valid JSON"):
        from_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["<|im_end|>"]}))
    with pytest.raises(ValueError, match=re.escape("non-negative ints, got '<|im_end|>'")):
        from_pretrained(path)


@pytest.mark.slow  # 23 s in a loaded 2-worker run, AMD EPYC AVX2
def test_engine_stops_on_a_generation_config_token(tmp_path, tokenizer):
    """Greedy decoding runs to the length limit until generation_config.json names the
    token the model emits first; then the sample ends there with finish reason 'eos'."""
    from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams

    def run(path):
        engine = Engine(from_pretrained(path), max_concurrent_decodes=1, max_cache_length=32,
                        max_prefill_length=8)  # fmt: skip
        sp = SamplingParams(temperature=0.0, max_new_tokens=6)
        return RolloutDriver(engine).generate([[40, 41, 42]], sp)[0]

    free = run(_folder(tmp_path / "a", tokenizer, template=False))
    first = int(free.token_ids[0])
    assert first != ENDOFTEXT and free.finish_reason == "length"  # a precondition
    stops = run(_folder(tmp_path / "b", tokenizer, generation={"eos_token_id": first},
                        template=False))  # fmt: skip
    assert stops.finish_reason == "eos"
    np.testing.assert_array_equal(stops.token_ids, [first])
