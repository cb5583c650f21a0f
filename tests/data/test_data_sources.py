"""Sources and field mapping: formats, line numbers, malformed rows, strict mode."""

import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.data.examples import FieldMap, MalformedRowError, load_examples, normalize_row
from jaxrl_llm.data.prompts import check_data_files
from jaxrl_llm.data.sources import DataSourceError, SourceConfig, read_records, require_source

BAD_JSONL_LINES = [
    '{"id": "a", "prompt": "1+1?", "answer": "2"}',  # 1 ok
    '{"id": "b", "prompt": "2+2?", "answer": ',  # 2 bad JSON
    "",  # 3 blank: ignored, not counted
    '["not", "an", "object"]',  # 4 not an object
    '{"id": "c", "answer": "3"}',  # 5 no prompt
    '{"id": "d", "prompt": "x?"}',  # 6 no answer
    '{"id": "e", "prompt": 7, "answer": "7"}',  # 7 prompt of the wrong type
    '{"id": "f", "prompt": "y?", "answer": {"x": 1}}',  # 8 answer of the wrong type
    '{"id": "a", "prompt": "dup?", "answer": "1"}',  # 9 duplicate id
    '{"id": "g", "prompt": "   ", "answer": "1"}',  # 10 empty prompt
    '{"id": "h", "prompt": "3*3?", "answer": 9}',  # 11 ok: numeric answer becomes "9"
]


def test_malformed_jsonl_rows_are_skipped_and_counted_with_line_numbers(tmp_path, caplog):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD_JSONL_LINES) + "\n")
    with caplog.at_level("WARNING"):
        examples, report = load_examples(SourceConfig(str(path)))
    assert [ex["id"] for ex in examples] == ["a", "h"]
    assert examples[1]["answer"] == "9"
    assert [bad.line for bad in report.malformed] == [2, 4, 5, 6, 7, 8, 9, 10]
    assert report.rows_read == 10 and report.kept == 2
    assert "duplicate id 'a'" in report.malformed[6].reason
    assert f"{path}:2: invalid JSON" in caplog.text
    assert report.as_metrics()["data/malformed_rows"] == 8


def test_strict_mode_raises_with_the_line_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD_JSONL_LINES) + "\n")
    with pytest.raises(MalformedRowError, match=r"bad\.jsonl:2: invalid JSON"):
        load_examples(SourceConfig(str(path)), strict=True)


def test_invalid_utf8_line_is_malformed(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "\xff", "answer": "1"}\n')
    examples, report = load_examples(SourceConfig(str(path)))
    assert len(examples) == 1 and examples[0]["id"] == "bytes.jsonl:1"
    assert report.malformed[0].line == 2 and "UTF-8" in report.malformed[0].reason


def test_json_array_gives_line_numbers_of_objects(tmp_path, math_rows):
    rows = math_rows(3)
    rows[1] = {"id": "q001", "prompt": "no answer"}
    path = tmp_path / "math.json"
    path.write_text(json.dumps(rows, indent=4))
    examples, report = load_examples(SourceConfig(str(path)))
    assert [ex["id"] for ex in examples] == ["q000", "q002"]
    assert examples[0] == {
        "id": "q000",
        "prompt": "What is 0 + 0?",
        "answer": "0",
        "source": "t",
    }
    # json.dumps(indent=4) puts "[" on line 1 and each 6-line object after it.
    assert [r.line for r in read_records(SourceConfig(str(path)))] == [2, 8, 12]
    assert report.malformed[0].line == 8


def test_json_array_syntax_error_raises_with_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"prompt": "a", "answer": "1"},\n  {"prompt": "b" "answer": "2"}\n]')
    with pytest.raises(ValueError, match=r"broken\.json:3:"):
        load_examples(SourceConfig(str(path)))


def test_field_mapping_candidates_dotted_keys_and_messages():
    fields = FieldMap()
    gsm = normalize_row({"question": "Q?", "answer": "4", "extra": 1}, fields, default_id="x:1")
    assert gsm == {"id": "x:1", "prompt": "Q?", "answer": "4", "extra": 1}
    math = normalize_row({"problem": "P", "solution": "S", "level": 3}, fields, default_id="m:2")
    assert (math["prompt"], math["answer"], math["level"]) == ("P", "S", 3)
    verl = {
        "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "U?"}],
        "reward_model": {"style": "rule", "ground_truth": ["a", "b"]},
        "data_source": "nq",
    }
    ex = normalize_row(verl, fields, default_id="v:1")
    assert ex["prompt"] == "U?" and ex["answer"] == ["a", "b"]
    assert ex["messages"][0] == {"role": "system", "content": "sys"}
    assert ex["reward_model"]["style"] == "rule" and ex["data_source"] == "nq"
    custom = FieldMap(prompt=("q",), answer=("gt",), id=("uid",))
    ex = normalize_row({"q": "a", "gt": 5, "uid": 12}, custom, default_id="c:1")
    assert (ex["id"], ex["prompt"], ex["answer"]) == ("12", "a", "5")


def test_parquet_source(tmp_path, math_rows):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(math_rows(5)), path)
    examples, report = load_examples(SourceConfig(str(path)))
    assert [ex["id"] for ex in examples] == [f"q{i:03d}" for i in range(5)]
    assert report.malformed == []


def _write_arrow_stream(path, rows):
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def test_hf_save_to_disk_folder(tmp_path, math_rows):
    # The layout datasets.Dataset.save_to_disk writes (LIMR ships its data this way).
    folder = tmp_path / "ds"
    folder.mkdir()
    _write_arrow_stream(folder / "data-00000-of-00002.arrow", math_rows(3))
    _write_arrow_stream(folder / "data-00001-of-00002.arrow", math_rows(5)[3:])
    (folder / "dataset_info.json").write_text("{}")
    shards = [{"filename": f"data-0000{i}-of-00002.arrow"} for i in range(2)]
    (folder / "state.json").write_text(json.dumps({"_data_files": shards}))
    examples, _ = load_examples(SourceConfig(str(folder)))
    assert [ex["id"] for ex in examples] == [f"q{i:03d}" for i in range(5)]

    # A DatasetDict: one such folder per split.
    root = tmp_path / "dd"
    (root / "train").mkdir(parents=True)
    _write_arrow_stream(root / "train" / "data-00000-of-00001.arrow", math_rows(2))
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
    (root / "train" / "state.json").write_text(json.dumps(state))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    examples, _ = load_examples(SourceConfig(str(root), split="train"))
    assert len(examples) == 2
    with pytest.raises(ValueError, match="no split 'test'"):
        load_examples(SourceConfig(str(root), split="test"))


def test_hub_style_folder_picks_files_by_split(tmp_path, math_rows):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(math_rows(4)), tmp_path / "data" / "train-0-of-1.parquet")
    rows = [{"question": "t?", "answer": "1"}]
    (tmp_path / "data" / "test.jsonl").write_text(json.dumps(rows[0]) + "\n")
    train, _ = load_examples(SourceConfig(str(tmp_path), split="train"))
    test, _ = load_examples(SourceConfig(str(tmp_path), split="test"))
    assert len(train) == 4 and [ex["id"] for ex in test] == ["test.jsonl:1"]


def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_examples(SourceConfig(str(tmp_path / "x.csv")))
    with pytest.raises(DataSourceError, match=r"data source = '.*nope\.jsonl': no such file"):
        load_examples(SourceConfig(str(tmp_path / "nope.jsonl")))


def test_a_missing_data_file_is_a_config_error_naming_its_field(tmp_path, monkeypatch):
    missing = str(tmp_path / "missing.jsonl")
    for field in ("train_file", "val_file"):
        message = (
            rf"^DataConfig\.{field} = '{re.escape(missing)}': no such file or folder; expected "
            r"a prompt file \(\.jsonl, \.json, \.parquet, \.arrow\) or a Hugging Face dataset "
            r"folder; fix the path$"
        )
        with pytest.raises(ConfigError, match=message):  # the command line's exit-2 error
            check_data_files(DataConfig(**{field: missing}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataSourceError, match=rf"relative to {re.escape(os.getcwd())}\)"):
        require_source("data/train.jsonl", "--data")
