"""docs/quickstart.md's commands, exactly as written, on a tiny HF folder and a user jsonl.

The folder is what a user brings: a random Qwen2 model saved with `save_pretrained`, a real
tokenizer with a ChatML chat template, and a `generation_config.json` naming `<|im_end|>`
(config.json names only `<|endoftext|>`, as base-model configs do). The data is a jsonl of
`question` / `answer` rows. The test reads the commands out of the quickstart (so the page
cannot drift from what runs), swaps in these paths, and runs them with the installed
`jaxrl-llm` in a fresh process (one device, as a user has).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # measured: 22-38 s for the file on 2 shared cores (CLI subprocesses)

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "docs" / "quickstart.md"
MODEL_PLACEHOLDER = "/path/to/Qwen2.5-0.5B-Instruct"
DATA_PLACEHOLDER = "/path/to/train.jsonl"


def quickstart_commands() -> dict[str, list[str]]:
    """argv of each ```bash block tagged `<!-- command: NAME -->` in the quickstart."""
    text = QUICKSTART.read_text()
    blocks = re.findall(r"<!-- command: (\w+) -->\s*```bash\n(.*?)```", text, re.S)
    return {name: shlex.split(body.replace("\\\n", " "), comments=True) for name, body in blocks}


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """(HF folder, train jsonl) as a user would bring them."""
    from jaxrl_llm.assets.build import char_tokenizer
    from jaxrl_llm.models import ModelConfig, init_model, save_pretrained

    root = tmp_path_factory.mktemp("quickstart")
    tok = char_tokenizer()
    endoftext, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_heads=4,
                      num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
                      eos_token_id=endoftext, pad_token_id=endoftext)  # fmt: skip
    model_dir = root / "my-model"
    save_pretrained(init_model(cfg, seed=0), model_dir, tokenizer=tok)
    generation = {"eos_token_id": [im_end, endoftext], "pad_token_id": endoftext}
    (model_dir / "generation_config.json").write_text(json.dumps(generation))
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)}
            for a, b in [(2, 3), (7, 5), (10, 4), (6, 6), (9, 1), (3, 8)]]  # fmt: skip
    data = root / "my-train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, data


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert argv[0] == "jaxrl-llm"
    exe = Path(sys.executable).with_name("jaxrl-llm")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as a user
    return subprocess.run([str(exe), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _with_paths(argv: list[str], model_dir: Path, data: Path) -> list[str]:
    swap = {MODEL_PLACEHOLDER: str(model_dir), DATA_PLACEHOLDER: str(data)}
    out = []
    for arg in argv:
        for old, new in swap.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return out


def test_quickstart_documents_the_shipped_config_and_its_smoke_run():
    cmds = quickstart_commands()
    assert {"train", "smoke", "plan"} <= set(cmds)
    train, smoke = cmds["train"], cmds["smoke"]
    assert smoke[: len(train)] == train  # the smoke run is the real command plus overrides
    assert "--gin_file=configs/grpo_custom.gin" in train
    shipped = (REPO / "configs" / "grpo_custom.gin").read_text()
    assert 'RolloutConfig.tool = "none"' in shipped  # not grpo_tiny's Python tool
    assert "SET_CHECKPOINT_PATH" in shipped and "SET_TRAIN_FILE" in shipped


def test_quickstart_smoke_run_on_a_users_hf_folder_and_jsonl(user_files, tmp_path):
    model_dir, data = user_files
    argv = _with_paths(quickstart_commands()["smoke"], model_dir, data)
    proc = _run(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [run_dir] = (tmp_path / "runs").glob("grpo_custom-*")
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "actor/pg_loss" in r]
    assert len(steps) == 2
    for r in steps:
        # 2 prompts x 4 samples, each at most 32 new tokens (the smoke overrides took).
        assert 0 < r["response_length/mean"] <= 32
    resolved = (run_dir / "config.gin").read_text()
    assert str(model_dir) in resolved and str(data) in resolved
    assert (run_dir / "hf" / "config.json").is_file()
    # Where the page says to look: the generations, as the chat template rendered the prompt.
    gens = [json.loads(ln) for ln in (run_dir / "generations" / "step_2.jsonl").open()]
    assert gens and all(g["prompt"].startswith("<|im_start|>user\nWhat is") for g in gens)
    assert {g["finish_reason"] for g in gens} <= {"eos", "length"}
    shown = _run(["jaxrl-llm", "samples", str(run_dir)], tmp_path)
    assert shown.returncode == 0 and gens[0]["prompt_id"] in shown.stdout, shown.stderr[-2000:]


def test_quickstart_plan_command_runs(user_files, tmp_path):
    model_dir, data = user_files
    argv = _with_paths(quickstart_commands()["plan"], model_dir, data)
    proc = _run([*argv, "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plan["fits"] in (True, None) and plan["bytes_per_device"]["peak"] > 0
