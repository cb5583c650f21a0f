"""The data fingerprint in the iterator state: restoring onto other prompts, answers or
settings is refused, and a state saved before the fingerprint covered the content (ids and
settings only) still resumes on its own data."""

import hashlib
import json

import pytest

from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pipeline(path, tokenizer, seed=7):
    config = PipelineConfig(SourceConfig(str(path)), global_batch_size=2, num_epochs=None,
                            seed=seed, max_prompt_length=32)  # fmt: skip
    return build_prompt_pipeline(config, tokenizer)


def _state(pipe):
    it = pipe.iterator()
    next(it)
    return json.loads(json.dumps(it.get_state()))  # as a JSON checkpoint holds it


def test_other_rows_under_the_same_ids_are_refused(tmp_path, char_tokenizer):
    """Rows without an id get `<file name>:<line>`: two files of the same name and length
    have the same ids, not the same prompts."""
    sums = [{"prompt": f"what is {i}+{i}?", "answer": str(2 * i)} for i in range(8)]
    words = [{"prompt": f"spell word {i}", "answer": f"w{i}"} for i in range(8)]
    a = _pipeline(_write(tmp_path / "a" / "train.jsonl", sums), char_tokenizer)
    b = _pipeline(_write(tmp_path / "b" / "train.jsonl", words), char_tokenizer)
    assert [p.example["id"] for p in a.prompts] == [p.example["id"] for p in b.prompts]
    with pytest.raises(ValueError, match="different prompts or pipeline settings"):
        b.iterator(_state(a))


@pytest.mark.parametrize("field", ["prompt", "answer"])
def test_an_edited_prompt_or_answer_is_refused(tmp_path, char_tokenizer, math_rows, field):
    rows = math_rows(8)
    edited = [dict(r) for r in rows]
    edited[5][field] = "9999"
    a = _pipeline(_write(tmp_path / "a.jsonl", rows), char_tokenizer)
    b = _pipeline(_write(tmp_path / "b.jsonl", edited), char_tokenizer)
    assert a.iterator(_state(a))  # its own state restores
    with pytest.raises(ValueError, match="different prompts or pipeline settings"):
        b.iterator(_state(a))


def _ids_only_fingerprint(pipe, seed=7):
    """The fingerprint states held before the content was hashed (ids and settings only),
    written out here so that a change to what the pipeline accepts for them shows."""
    key = {
        "ids": [p.example["id"] for p in pipe.prompts],
        "settings": [True, seed, 2, None, True, 1],
    }
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def test_a_state_saved_before_content_fingerprints_still_resumes(tmp_path, char_tokenizer,
                                                                 math_rows):  # fmt: skip
    pipe = _pipeline(_write(tmp_path / "train.jsonl", math_rows(8)), char_tokenizer)
    it = pipe.iterator()
    first = next(it)
    state = it.get_state()
    old = {"version": state["version"], "fingerprint": _ids_only_fingerprint(pipe),
           "grain": state["grain"]}  # fmt: skip
    assert next(pipe.iterator(old)).ids == next(it).ids != first.ids
    other = dict(old, fingerprint=_ids_only_fingerprint(pipe, seed=8))  # other settings
    with pytest.raises(ValueError, match="different prompts or pipeline settings"):
        pipe.iterator(other)
