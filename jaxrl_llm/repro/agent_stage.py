"""The agent miniature's preparation: one short SFT on worked episodes of the built-in
'arithmetic' environment, then every seed's GRPO starts from that checkpoint.

Episodes (`agents.arithmetic.demonstration`) are encoded exactly as RL's episodes are
(`agents.demonstrations.encode_episode`: tool answers masked), on training-split problems of
all four levels; the validation problems of the RL runs are the other split, never seen.
Half of the episodes (`TOOL_SHARE`) call the tools, the others solve the problem in words,
step by step: the SFT policy then chooses, and RL learns when calling pays. A run that
finds the checkpoint of an SFT with the same settings in its output folder
(`prepared.json`) reuses it rather than training it again.
"""

from __future__ import annotations

import json

import numpy as np

from jaxrl_llm.agents.arithmetic import ArithmeticEnv, demonstration
from jaxrl_llm.data.tasks import arithmetic
from jaxrl_llm.data.tasks.stepwise import stepwise_solution
from jaxrl_llm.repro.specs import Prepared, PrepOptions
from jaxrl_llm.repro.torl_stage import prepared_sft, sft_run

SFT_GIN = "agent_sft_tiny.gin"
N_PROBLEMS = 4000
# The share of demonstrations that call the calculator tools; the others solve the problem
# in words (`_in_words`), so that the SFT policy has a choice for RL to sharpen: when to call.
TOOL_SHARE = 0.5


def prepare_agent(opts: PrepOptions) -> Prepared:
    """Writes the demonstrations, fine-tunes one checkpoint (or reuses the one a run with the
    same settings left in OUT: `torl_stage.prepared_sft`), points the arm at it."""
    problems = arithmetic.generate_problems(N_PROBLEMS, seed=0, id_prefix="sft", split="train")
    tools = ArithmeticEnv().tools
    data = opts.out_dir / "sft_data" / "episodes.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    with_tools = np.random.default_rng(0).random(len(problems)) < TOOL_SHARE
    with data.open("w") as f:
        for p, tool in zip(problems, with_tools, strict=True):
            messages = demonstration(p) if tool else _in_words(p)
            f.write(json.dumps({"messages": messages, "tools": tools}) + "\n")
    out = opts.out_dir / "sft" / "agent"
    params = [f"SFTConfig.train_file = '{data}'", f"SFTConfig.out_dir = '{out}'"]
    if opts.prep_steps is not None:
        params.append(f"SFTConfig.steps = {opts.prep_steps}")
    notes = prepared_sft(SFT_GIN, data, out, params, sft_run)
    return Prepared(arm_params={"grpo": (f"CHECKPOINT = '{out / 'hf'}'",)}, notes={"grpo": notes})


def _in_words(problem: dict) -> list[dict[str, str]]:
    """An episode that calls no tool: the problem solved in text, step by step (as ToRL's
    no-tool SFT solutions are), in one turn; the tools are still offered in the prompt."""
    return [
        {"role": "user", "content": str(problem["prompt"])},
        {"role": "assistant", "content": stepwise_solution(problem)},
    ]
