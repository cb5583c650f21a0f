"""The ToRL miniature's preparation: two SFT checkpoints with the same budget, one per arm.

Both start from the shipped tiny checkpoint and train the same steps, batch, learning rate
and prompts (``torl_sft_tiny.gin``); only the responses differ: the tool arm's are ToRL-style
Python solutions, the no-tool arm's step-by-step text arithmetic
(``data.tasks.stepwise``: every step a 2-digit by 1-digit product or a sum), so that the
no-tool model can compute in its head at some level and the RL comparison isolates what the
tool adds rather than what the model can do at all.
"""

from __future__ import annotations

import time

from jaxrl_llm.data.tasks import arithmetic, stepwise
from jaxrl_llm.repro.specs import Prepared, PrepOptions

SFT_GIN = "torl_sft_tiny.gin"
N_PROBLEMS = 4000
STYLES = {"tool": "tool", "no_tool": "stepwise"}  # arm -> SFT response style


def sft_run(gin_files: list[str], params: list[str]) -> dict[str, float]:
    """One `jaxrl-llm sft` in this process; returns its last metrics."""
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.sft import SFTConfig, run_sft

    parse_gin(gin_files, params)
    return run_sft(SFTConfig())


def prepare_torl(opts: PrepOptions) -> Prepared:
    """Writes the two SFT files, fine-tunes a checkpoint per arm, points each arm at its own."""
    problems = arithmetic.generate_problems(N_PROBLEMS, seed=0, id_prefix="sft", split="train")
    arm_params: dict[str, tuple[str, ...]] = {}
    notes: dict[str, dict[str, str | float]] = {}
    for arm, style in STYLES.items():
        data = arithmetic.write_jsonl(
            stepwise.sft_rows(problems, style), opts.out_dir / "sft_data" / f"{style}.jsonl"
        )
        out = opts.out_dir / "sft" / arm
        params = [f"SFTConfig.train_file = '{data}'", f"SFTConfig.out_dir = '{out}'"]
        if opts.prep_steps is not None:
            params.append(f"SFTConfig.steps = {opts.prep_steps}")
        t0 = time.perf_counter()
        last = sft_run([SFT_GIN], params)
        notes[arm] = {
            "sft_style": style,
            "sft_val_loss": round(float(last.get("val/loss", float("nan"))), 4),
            "sft_s": round(time.perf_counter() - t0, 1),
        }
        arm_params[arm] = (f"CHECKPOINT = '{out / 'hf'}'",)
    return Prepared(arm_params=arm_params, notes=notes)
