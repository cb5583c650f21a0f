"""Reading data files that trip the readers: same-named files in one dataset folder, files
that cannot be decoded at all (one ``DataSourceError`` naming the file, not a traceback), and
a UTF-8 byte-order mark at the start of a file."""

import json

import pytest

from jaxrl_llm.data.examples import MalformedRowError, load_examples
from jaxrl_llm.data.sources import DataSourceError, SourceConfig

ROWS = [{"prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)]


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_same_named_files_of_one_split_keep_all_rows_with_relative_path_ids(tmp_path):
    for lang in ("en", "fr"):
        _write_jsonl(tmp_path / "train" / lang / "data.jsonl", ROWS)
    _write_jsonl(tmp_path / "train" / "other.jsonl", ROWS[:1])
    examples, report = load_examples(SourceConfig(str(tmp_path)))
    assert report.malformed == [] and report.kept == 7
    ids = [ex["id"] for ex in examples]
    assert ids == [
        "train/en/data.jsonl:1",
        "train/en/data.jsonl:2",
        "train/en/data.jsonl:3",
        "train/fr/data.jsonl:1",
        "train/fr/data.jsonl:2",
        "train/fr/data.jsonl:3",
        "other.jsonl:1",  # a file whose name no other file shares keeps its plain id
    ]


def test_a_duplicate_id_names_the_file_of_the_first_row(tmp_path):
    _write_jsonl(tmp_path / "train" / "a.jsonl", [{"id": "x", **ROWS[0]}])
    _write_jsonl(tmp_path / "train" / "b.jsonl", [{"id": "x", **ROWS[1]}])
    with pytest.raises(MalformedRowError) as e:
        load_examples(SourceConfig(str(tmp_path)), strict=True)
    first = tmp_path / "train" / "a.jsonl"
    assert f"duplicate id 'x' (first at {first}:1)" in str(e.value)


def test_a_json_file_that_is_not_utf8_raises_a_source_error_naming_it(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"prompt": "a",\n "answer": "1\xff"}]')
    with pytest.raises(DataSourceError, match=rf"^{path}:2:14: invalid UTF-8"):
        load_examples(SourceConfig(str(path)))


def test_a_parquet_file_that_cannot_be_read_raises_a_source_error_naming_it(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(DataSourceError, match=rf"^{path}: cannot read as parquet"):
        load_examples(SourceConfig(str(path)))


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_a_utf8_byte_order_mark_does_not_cost_the_first_row(tmp_path, suffix):
    path = tmp_path / f"bom.{suffix}"
    if suffix == "jsonl":
        text = "".join(json.dumps(r) + "\n" for r in ROWS)
    else:
        text = json.dumps(ROWS, indent=1)
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    examples, report = load_examples(SourceConfig(str(path)))
    assert report.malformed == []
    assert [ex["prompt"] for ex in examples] == [r["prompt"] for r in ROWS]
    lines = [1, 2, 3] if suffix == "jsonl" else [2, 6, 10]  # indent=1: "[", then 4 per object
    assert [ex["id"] for ex in examples] == [f"bom.{suffix}:{line}" for line in lines]


@pytest.mark.parametrize("content", [b"", b"not an arrow stream"], ids=["empty", "junk"])
def test_an_arrow_file_that_cannot_be_read_raises_a_source_error_naming_it(tmp_path, content):
    path = tmp_path / "bad.arrow"
    path.write_bytes(content)
    with pytest.raises(DataSourceError, match=rf"^{path}: cannot read as Arrow IPC"):
        load_examples(SourceConfig(str(path)))


def test_a_save_to_disk_shard_that_cannot_be_read_names_the_shard(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "d.arrow"}]}))
    (tmp_path / "d.arrow").write_bytes(b"truncated")
    with pytest.raises(DataSourceError, match=rf"^{tmp_path / 'd.arrow'}: cannot read as Arrow"):
        load_examples(SourceConfig(str(tmp_path)))
