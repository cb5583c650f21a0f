"""The agent miniature's preparation: one short SFT on worked episodes of the built-in
'arithmetic' environment, then every seed's GRPO starts from that checkpoint.

Episodes (`agents.arithmetic.demonstration`) are encoded exactly as RL's episodes are
(`agents.demonstrations.encode_episode`: tool answers masked), on training-split problems of
all four levels; the validation problems of the RL runs are the other split, never seen.
"""

from __future__ import annotations

import json
import time

from jaxrl_llm.agents.arithmetic import ArithmeticEnv, demonstration
from jaxrl_llm.data.tasks import arithmetic
from jaxrl_llm.repro.specs import Prepared, PrepOptions
from jaxrl_llm.repro.torl_stage import sft_run

SFT_GIN = "agent_sft_tiny.gin"
N_PROBLEMS = 4000


def prepare_agent(opts: PrepOptions) -> Prepared:
    """Writes the demonstrations, fine-tunes one checkpoint, points the arm at it."""
    problems = arithmetic.generate_problems(N_PROBLEMS, seed=0, id_prefix="sft", split="train")
    tools = ArithmeticEnv().tools
    data = opts.out_dir / "sft_data" / "episodes.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    with data.open("w") as f:
        for p in problems:
            f.write(json.dumps({"messages": demonstration(p), "tools": tools}) + "\n")
    out = opts.out_dir / "sft" / "agent"
    params = [f"SFTConfig.train_file = '{data}'", f"SFTConfig.out_dir = '{out}'"]
    if opts.prep_steps is not None:
        params.append(f"SFTConfig.steps = {opts.prep_steps}")
    t0 = time.perf_counter()
    last = sft_run([SFT_GIN], params)
    notes = {
        "sft_val_loss": round(float(last.get("val/loss", float("nan"))), 4),
        "sft_s": round(time.perf_counter() - t0, 1),
    }
    return Prepared(arm_params={"grpo": (f"CHECKPOINT = '{out / 'hf'}'",)}, notes={"grpo": notes})
