"""The ToRL miniature's preparation: two SFT checkpoints with the same budget, one per arm.

Both start from the shipped tiny checkpoint and train the same steps, batch, learning rate
and prompts (``torl_sft_tiny.gin``); only the responses differ: the tool arm's are ToRL-style
Python solutions, the no-tool arm's step-by-step text arithmetic
(``data.tasks.stepwise``: every step a 2-digit by 1-digit product or a sum), so that the
no-tool model can compute in its head at some level and the RL comparison isolates what the
tool adds rather than what the model can do at all.

Every SFT of the preparations (ToRL's two, Search-R1's and the agent's one) goes through
`prepared_sft`: a run that finds the checkpoint of an SFT with the same settings in its
output folder (`prepared.json`: the gin file, the bindings and the data, hashed) reuses it
rather than training it again, so a resumed reproduction never mixes checkpoints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from jaxrl_llm.data.tasks import arithmetic, stepwise
from jaxrl_llm.repro.specs import (
    PREPARED,
    Prepared,
    PrepOptions,
    finished_preparation,
    preparation_signature,
)

SFT_GIN = "torl_sft_tiny.gin"
N_PROBLEMS = 4000
STYLES = {"tool": "tool", "no_tool": "stepwise"}  # arm -> SFT response style


def sft_run(gin_files: list[str], params: list[str]) -> dict[str, float]:
    """One `jaxrl-llm sft` in this process; returns its last metrics."""
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.sft import SFTConfig, run_sft

    parse_gin(gin_files, params)
    return run_sft(SFTConfig())


def prepared_sft(
    gin_file: str,
    data: Path,
    out: Path,
    params: list[str],
    run: Callable[[list[str], list[str]], dict[str, float]],
) -> dict[str, float | bool]:
    """The notes of an SFT into `out` (`out/hf`, trained from `data` by `run([gin_file],
    params)`): its last validation loss and seconds, or, when a run with the same settings
    finished there (`finished_preparation`), those it recorded with `reused`. The record is
    removed before training and written after it, so a crash mid-training leaves none."""
    signature = preparation_signature(gin_file, data, params)
    notes = finished_preparation(out, signature)
    if notes is not None:
        return notes
    (out / PREPARED).unlink(missing_ok=True)
    t0 = time.perf_counter()
    last = run([gin_file], params)
    notes = {
        "sft_val_loss": round(float(last.get("val/loss", float("nan"))), 4),
        "sft_s": round(time.perf_counter() - t0, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / PREPARED).write_text(json.dumps({"signature": signature, **notes}) + "\n")
    return notes


def prepare_torl(opts: PrepOptions) -> Prepared:
    """Writes the two SFT files, fine-tunes a checkpoint per arm (or reuses the one a run
    with the same settings left: `prepared_sft`), points each arm at its own."""
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
        notes[arm] = {"sft_style": style, **prepared_sft(SFT_GIN, data, out, params, sft_run)}
        arm_params[arm] = (f"CHECKPOINT = '{out / 'hf'}'",)
    return Prepared(arm_params=arm_params, notes=notes)
