"""Readable generations: step_N.jsonl records, the TensorBoard text summary, and
`jaxrl-llm samples`."""

import json
import struct

import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.metrics.generations import GenerationLog, read_generations
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.types import Completion, Rollout

MODEL_1, TOOL, MODEL_2 = "Use code.\n```output", "\n42\n```\n", " so \\boxed{42}"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


def completion(tok, prompt, parts, *, reason="eos"):
    """A sample whose response is `parts`: (text, is_model_text) in order."""
    ids, mask = [], []
    for text, model in parts:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [int(model)] * len(piece)
    zeros = np.zeros(len(ids), np.float32)
    return Completion(
        prompt_index=0, sample_index=0, prompt_ids=np.asarray(tok(prompt)["input_ids"]),
        token_ids=np.asarray(ids, np.int32), logprobs=zeros, raw_logprobs=zeros,
        response_mask=np.asarray(mask, np.int32), finish_reason=reason,
        text="".join(t for t, _ in parts), tool_calls=sum(not m for _, m in parts),
    )  # fmt: skip


def rollout(tok):
    comps = [
        completion(tok, "6*7?", [(MODEL_1, True), (TOOL, False), (MODEL_2, True)]),
        completion(tok, "6*7?", [("41", True)], reason="length"),
        completion(tok, "1+1?", [("\\boxed{2}", True)]),
        completion(tok, "1+1?", [("3", True)]),
    ]
    scores = np.asarray([1.0, 0.0, 1.0, 0.0], np.float32)
    return Rollout(tuple(comps), ("42", "42", "2", "2"), ("a", "b"), scores, 2, 1)


def tensorboard_texts(folder):
    """(tag, text) of every text summary in the event files under `folder` (TFRecord
    framing: length, its CRC, the Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 16 + length
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    out.append((value.tag, value.tensor.string_val[0].decode()))
    return out


def test_a_step_is_written_as_readable_text(tmp_path, tokenizer):
    log = GenerationLog(tmp_path, 3, tokenizer)
    log.write(5, rollout(tokenizer))
    log.close()
    step, records = read_generations(tmp_path)
    assert step == 5 and len(records) == 3  # the limit: the first 3 samples of the batch
    first = records[0]
    assert first["prompt"] == tokenizer.decode(tokenizer("6*7?")["input_ids"])
    assert first["response"] == MODEL_1 + TOOL + MODEL_2
    assert first["tool_outputs"] == [TOOL] and first["tool_calls"] == 1
    assert first["turns"] == [["model", MODEL_1], ["tool", TOOL], ["model", MODEL_2]]
    assert records[1]["turns"] == [["model", "41"]]
    assert (first["prompt_id"], first["sample"], first["answer"]) == ("a", 0, "42")
    assert [r["reward"] for r in records] == [1.0, 0.0, 1.0]
    assert [r["finish_reason"] for r in records] == ["eos", "length", "eos"]
    assert [(r["prompt_id"], r["sample"]) for r in records] == [("a", 0), ("a", 1), ("b", 0)]
    texts = tensorboard_texts(tmp_path / "tensorboard")
    assert len(texts) == 1 and texts[0][0].startswith("generations")
    assert "reward 1 · eos · 1 tool call" in texts[0][1] and "    Use code." in texts[0][1]


def test_samples_command_prints_a_step(tmp_path, tokenizer, capsys):
    log = GenerationLog(tmp_path, 4, tokenizer, tensorboard=False)
    for step in (1, 2):
        log.write(step, rollout(tokenizer))
    assert cli.main(["samples", str(tmp_path), "--step", "1", "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("=== step 1 · prompt a · sample 0 · reward 1 · eos")
    turns = f"--- model turn 1\n{MODEL_1}\n--- tool (masked)\n{TOOL}\n--- model turn 2\n{MODEL_2}\n"
    assert "--- response, turn by turn (special tokens kept;" in printed and turns in printed
    assert "(1 samples of step 1; steps logged: [1, 2])" in printed
    assert cli.main(["samples", str(tmp_path), "--json"]) == 0  # the latest step
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 2, 2, 2]
    assert cli.main(["samples", str(tmp_path), "--step", "2", "--limit", "2"]) == 0
    assert "--- response\n41\n" in capsys.readouterr().out  # one turn: printed whole
    with pytest.raises(FileNotFoundError, match=r"no generations for step 7.*logged: \[1, 2\]"):
        read_generations(tmp_path, 7)
    with pytest.raises(FileNotFoundError, match="log_generations = 0"):
        read_generations(tmp_path / "elsewhere")


def test_zero_logs_nothing_and_negative_is_refused(tmp_path, tokenizer):
    GenerationLog(tmp_path, 0, tokenizer).write(1, rollout(tokenizer))
    assert not (tmp_path / "generations").exists()
    with pytest.raises(ValueError, match="log_generations = -1"):
        GenerationLog(tmp_path, -1, tokenizer)
