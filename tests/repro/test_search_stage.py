"""Search-R1's preparation: demonstrations from the retrieval task and its real BM25 tool,
one SFT checkpoint for every arm (SFT replaced by a stand-in: no training)."""

import json

from jaxrl_llm.repro import search_stage
from jaxrl_llm.repro.specs import PrepOptions, get_repro


def test_demonstrations_search_the_subject_and_copy_the_answer(tmp_path):
    rows = search_stage.demonstrations(tmp_path, 12)
    questions = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == len(questions) == 12
    for row, q in zip(rows, questions):
        assert row["prompt"] == q["question"]  # the SFT loader's chat template wraps it
        head, rest = row["response"].split(" </search>", 1)
        subject = head.removeprefix("<search> ")
        assert subject in q["question"]
        info = rest.split("<information>")[1].split("</information>")[0]
        assert f"Doc 1(Title: {subject})" in info and q["answer"] in info
        assert row["response"].endswith(f"</information>\n\n<answer> {q['answer']} </answer>")


def test_every_arm_starts_from_one_checkpoint(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(search_stage, "N_TRAIN", 6)

    def fake_sft(files, params):
        calls.append(params)
        (tmp_path / "sft" / "hf").mkdir(parents=True, exist_ok=True)
        (tmp_path / "sft" / "hf" / "config.json").write_text("{}")
        return {"val/loss": 0.25}

    monkeypatch.setattr(search_stage, "sft_run", fake_sft)
    prepared = search_stage.prepare_search(PrepOptions(tmp_path, (0,), prep_steps=2))
    (params,) = calls
    assert params[2] == "SFTConfig.steps = 2"
    checkpoint = f"PolicyConfig.checkpoint = '{tmp_path / 'sft' / 'hf'}'"
    arms = [arm.name for arm in get_repro("search-r1").arms]
    assert arms == ["search", "no_search", "search_unmasked"]
    assert [prepared.params(arm, 0) for arm in arms] == [(checkpoint,)] * 3
    assert prepared.notes["sft_val_loss"] == 0.25
    assert len((tmp_path / "search_sft.jsonl").read_text().splitlines()) == 6
    assert get_repro("search-r1").prepare_fn() is search_stage.prepare_search
    # The same settings again: the finished SFT is reused, not trained again.
    again = search_stage.prepare_search(PrepOptions(tmp_path, (0, 1), prep_steps=2))
    assert len(calls) == 1 and again.notes == {**prepared.notes, "reused": True}
