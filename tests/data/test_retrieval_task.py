"""The built-in retrieval task: deterministic facts, a fixed split, answerable by BM25."""

import json

import pytest

from jaxrl_llm.data.tasks import retrieval
from jaxrl_llm.rewards import exact_match_reward


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    paths = retrieval.write_task(tmp_path_factory.mktemp("task"), n_train=120, n_val=12, seed=3)
    return paths, {name: read(path) for name, path in paths.items()}


def test_files_counts_and_fields(task):
    paths, rows = task
    assert sorted(paths) == ["corpus", "train", "val"]
    assert (len(rows["train"]), len(rows["val"])) == (120, 12)
    assert len(rows["corpus"]) >= 132  # extra facts stay as distractor documents
    docs = {d["id"]: d["contents"] for d in rows["corpus"]}
    assert len(docs) == len(rows["corpus"])
    for split in ("train", "val"):
        for i, row in enumerate(rows[split]):
            assert row["id"] == f"{split}-{i:05d}"
            assert row["prompt"] == row["question"] and row["golden_answers"] == [row["answer"]]
            assert retrieval.split_of(row["question"]) == split
            title, sentence = docs[row["doc_id"]].split("\n")
            assert row["answer"] in sentence and title in row["question"]
            reply = f"<think>found it</think> <answer> {row['answer']} </answer>"
            assert exact_match_reward(reply, row["answer"]) == 1.0
    questions = [r["question"] for s in ("train", "val") for r in rows[s]]
    assert len(set(questions)) == len(questions)


def test_deterministic_by_seed(task, tmp_path):
    paths, _ = task
    again = retrieval.write_task(tmp_path / "a", n_train=120, n_val=12, seed=3)
    for name in paths:
        assert again[name].read_bytes() == paths[name].read_bytes()
    other = retrieval.build_task(n_train=120, n_val=12, seed=4)
    assert other["train"] != read(paths["train"])


def test_split_is_fixed_by_the_question():
    # Whatever seed produced a question, it lands on the same side.
    for seed in range(3):
        for fact in retrieval.generate_facts(50, seed=seed):
            assert retrieval.split_of(fact.question) in retrieval.SPLITS
    facts = retrieval.generate_facts(2000, seed=0)
    held_out = sum(retrieval.split_of(f.question) == "val" for f in facts) / len(facts)
    assert 0.07 < held_out < 0.13  # about HELDOUT_PERCENT


def test_names_are_invented_and_unique():
    facts = retrieval.generate_facts(500, seed=1)
    names = [f.subject for f in facts] + [f.answer for f in facts if f.kind != "length"]
    assert len(set(names)) == len(names)
    assert all(5 <= len(n) <= 8 and n.isalpha() and n[0].isupper() for n in names)
    assert {f.kind for f in facts} == set(retrieval.KINDS)
    with pytest.raises(ValueError, match="unknown fact kind"):
        retrieval.generate_facts(1, kinds=("nope",))


def test_bm25_answers_every_question(task):
    from jaxrl_llm.tools.search import make_search_tool

    paths, rows = task
    tool = make_search_tool(paths["corpus"], k=3)
    for row in rows["train"] + rows["val"]:
        assert tool.retriever.search(row["question"], 1)[0].id == row["doc_id"]
