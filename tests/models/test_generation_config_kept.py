"""A checkpoint saved from one it was loaded from keeps the source's generation_config.json
(its sampling defaults: what transformers' `generate` does when called without arguments),
with the ids that end a sample and the pad id merged in: an export must not silently turn a
sampling model greedy."""

import json

from transformers import GenerationConfig

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, save_pretrained

# The shipped tokenizer's chat template ends a turn with <|im_end|> (id 2, also config.json's
# eos); 5 is a further stop id only generation_config.json names.
SOURCE = {"bos_token_id": 1, "eos_token_id": [2, 5], "pad_token_id": 0, "do_sample": True,
          "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}  # fmt: skip


def test_a_saved_model_keeps_the_generation_config_it_was_loaded_with(tmp_path, builtin_copy):
    src, out, again = builtin_copy, tmp_path / "out", tmp_path / "again"
    (src / "generation_config.json").write_text(json.dumps(SOURCE))
    save_pretrained(from_pretrained(src), out)
    written = json.loads((out / "generation_config.json").read_text())
    assert written == SOURCE, written
    a, b = GenerationConfig.from_pretrained(src), GenerationConfig.from_pretrained(out)
    assert a.to_dict() == b.to_dict()

    # Twice through: the same file; a model of a folder without one writes none, as before.
    save_pretrained(from_pretrained(out), again)
    assert json.loads((again / "generation_config.json").read_text()) == SOURCE
    save_pretrained(from_pretrained(builtin_checkpoint()), tmp_path / "plain")
    assert not (tmp_path / "plain" / "generation_config.json").exists()


def test_the_stop_ids_and_pad_id_are_merged_into_the_source_generation_config(
    tmp_path, builtin_copy
):
    """config.json's eos (2) and pad (0) and generation_config.json's own: every id that ends a
    sample (`ModelConfig.eos_token_ids`) is written; the source's pad id is kept."""
    src, out = builtin_copy, tmp_path / "out"
    source = {"eos_token_id": 7, "pad_token_id": 3, "do_sample": True, "top_k": 20}
    (src / "generation_config.json").write_text(json.dumps(source))
    save_pretrained(from_pretrained(src), out)
    written = json.loads((out / "generation_config.json").read_text())
    assert written == {**source, "eos_token_id": [2, 7]}, written
