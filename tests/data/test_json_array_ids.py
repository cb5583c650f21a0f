"""Ids of JSON-array rows without an id field: one per element, also when several elements
share a line (`json.dump(rows, f)` writes the whole array on line 1, as LIMR's
`lim_selection.py` writes its subsets), while the ids of indented arrays and jsonl files stay
`<file name>:<line>` (resumed runs' data fingerprints and LIMR's records hold them)."""

import json

from jaxrl_llm.data import limr_select
from jaxrl_llm.data.examples import load_examples
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig, read_records

ROWS = [{"prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(5)]


def test_a_compact_json_array_gives_every_element_its_own_id(tmp_path):
    path = tmp_path / "math8k.json"
    path.write_text(json.dumps(ROWS))  # one line
    examples, report = load_examples(SourceConfig(str(path)))
    assert [ex["id"] for ex in examples] == [f"math8k.json[{i}]" for i in range(5)]
    assert [ex["prompt"] for ex in examples] == [r["prompt"] for r in ROWS]
    assert report.malformed == [] and report.kept == 5
    # the RAND baseline draws from all five, and writes the chosen objects back
    out = tmp_path / "rand.json"
    assert limr_select.random_subset(path, 3, 0, out) == 3
    assert all(row in ROWS for row in json.loads(out.read_text()))


def test_indented_arrays_and_jsonl_keep_their_line_ids(tmp_path):
    indented = tmp_path / "math.json"
    indented.write_text(json.dumps(ROWS[:3], indent=4))  # "[", then 4 lines per object
    examples, _ = load_examples(SourceConfig(str(indented)))
    assert [ex["id"] for ex in examples] == ["math.json:2", "math.json:6", "math.json:10"]
    lines = tmp_path / "math.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    examples, _ = load_examples(SourceConfig(str(lines)))
    assert [ex["id"] for ex in examples] == ["math.jsonl:1", "math.jsonl:2", "math.jsonl:3"]


def test_only_elements_that_share_a_line_are_named_by_position(tmp_path):
    path = tmp_path / "mixed.json"
    texts = [json.dumps(r) for r in ROWS[:4]]
    path.write_text(f"[\n{texts[0]},\n{texts[1]}, {texts[2]},\n{texts[3]}\n]\n")
    assert [r.line for r in read_records(SourceConfig(str(path)))] == [2, 3, 3, 4]
    examples, report = load_examples(SourceConfig(str(path)))
    ids = ["mixed.json:2", "mixed.json[1]", "mixed.json[2]", "mixed.json:4"]
    assert [ex["id"] for ex in examples] == ids and report.malformed == []


def test_compact_array_trains_on_every_prompt(tmp_path, char_tokenizer):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(ROWS))
    config = PipelineConfig(SourceConfig(str(path)), global_batch_size=5, max_prompt_length=32)
    pipe = build_prompt_pipeline(config, char_tokenizer)
    assert pipe.steps_per_epoch == 1
    assert sorted(next(pipe.iterator()).prompts) == sorted(r["prompt"] for r in ROWS)
