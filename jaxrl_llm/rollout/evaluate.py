"""`jaxrl-llm eval`: pass@1, pass@k (unbiased) and maj@k of a checkpoint on a prompt set.

Samples with the rollout engine and driver (the tool too, with `--tool python`), scores with
`--reward` (a registered name or `package.module:function`), and summarises with
`metrics.pass_at_k`. The model is loaded sharded on `--mesh` in `--dtype` (`rollout.loading`).
`--preset math500|aime24|amc23` reads those sets' files as published (field names, split).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.config import add_gin_arguments, parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.examples import FieldMap
from jaxrl_llm.data.sources import SourceConfig, require_source
from jaxrl_llm.metrics.pass_at_k import majority_correct_at, pass_at_k
from jaxrl_llm.rollout.loading import add_model_arguments, load_sampling_model

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalPreset:
    """How a published evaluation set's files name their fields, and its split."""

    fields: FieldMap
    split: str


# Field names as published: MATH-500 (HuggingFaceH4/MATH-500: problem, solution, answer,
# unique_id); AIME 2024 (HuggingFaceH4/aime_2024: problem, answer, id; Maxwell-Jia/AIME_2024:
# Problem, Answer, ID; split "train"); AMC 2023 (math-ai/amc23: question, answer, id;
# AI-MO/aimo-validation-amc: problem, answer). The short final `answer` comes before the full
# worked `solution`, which is used only where a file has no answer column.
EVAL_PRESETS = {
    "math500": EvalPreset(
        FieldMap(prompt=("problem",), answer=("answer", "solution"), id=("unique_id", "id")),
        split="test",
    ),
    "aime24": EvalPreset(
        FieldMap(
            prompt=("problem", "Problem", "question"),
            answer=("answer", "Answer", "solution", "Solution"),
            id=("id", "ID"),
        ),
        split="train",
    ),
    "amc23": EvalPreset(
        FieldMap(prompt=("question", "problem"), answer=("answer", "solution"), id=("id",)),
        split="test",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)  # --checkpoint, --mesh, --dtype
    parser.add_argument("--data", default=None, help="jsonl/json/parquet, tfds:NAME, or builtin")
    parser.add_argument("--data-dir", default=None, help="TFDS data_dir")
    parser.add_argument(
        "--preset", choices=sorted(EVAL_PRESETS), default=None,
        help="read --data with that set's published field names and split",
    )  # fmt: skip
    parser.add_argument("--split", default=None, help="default: the preset's, else test")
    parser.add_argument(
        "--reward", default="math",
        help="reward that scores a sample: a registered name or package.module:function",
    )  # fmt: skip
    parser.add_argument("--limit", type=int, default=None, help="first N problems")
    parser.add_argument("--template", default="chat")
    parser.add_argument("--system-prompt", default=None)
    from jaxrl_llm.tools.factory import BUILTIN_TOOLS, NO_TOOL

    # The built-ins that need no further setting (search needs a corpus this command lacks).
    tools = tuple(name for name, tool in BUILTIN_TOOLS.items() if not tool.requires)
    parser.add_argument("--tool", choices=tools, default=NO_TOOL)
    parser.add_argument("--n", type=int, default=1, help="samples per problem")
    parser.add_argument("--k", type=int, nargs="*", default=None, help="k values (default n)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write results JSON here")
    # Settings without a flag (the sandbox's backend and limits, a reward's options), e.g.
    # --gin_param='SandboxConfig.backend="subprocess"' where bubblewrap is missing.
    add_gin_arguments(parser)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Sample `--n` completions per problem with the RL rollout stage (the same engine, driver,
    tool and reward pool as training), then pass@k and maj@k."""
    from flax import nnx

    from jaxrl_llm.rewards.config import RewardConfig, build_reward_pool
    from jaxrl_llm.rollout.config import RolloutConfig
    from jaxrl_llm.rollout.stage import RolloutStage

    _check(args)
    parse_gin(args.gin_file, args.gin_param)
    reward_cfg = RewardConfig(name=args.reward, workers=1)
    pool = build_reward_pool(reward_cfg, field="--reward")
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(pool.close)
        source = cleanup.enter_context(_source(args))  # the built-in set's file: this run's
        loaded = load_sampling_model(args)
        rollout = RolloutConfig(
            n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_p=args.top_p, tool=args.tool, max_slots=64,
        )  # fmt: skip
        stage = RolloutStage(rollout, loaded.model, loaded.tokenizer, loaded.mesh,
                             max_prompt_length=args.max_prompt_length, seed=args.seed)  # fmt: skip
        cleanup.callback(stage.close)
        stage.sync_weights(nnx.state(loaded.model))
        for i, batch in enumerate(_prompts(args, source, loaded.tokenizer).iterator()):
            got = stage.generate(batch, step=0, attempt=i + 1, reward=pool)
            rows += _rows(got, reward_cfg.correct)
            if args.limit and len(rows) >= args.limit:
                break
    rows = rows[: args.limit]
    result = _summary(rows, args.n, sorted(set(args.k or [args.n])))
    result = {"checkpoint": str(loaded.path), "dtype": loaded.dtype, "reward": args.reward,
              **result}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": result, "samples": rows}, indent=1))
    return result


def _check(args: argparse.Namespace) -> None:
    """Every flag in range, by its name (`ConfigError`), before a worker starts or a model
    loads."""
    from jaxrl_llm.rollout.commands import check_mesh_flag, check_sampling_flags

    check_sampling_flags(args)  # --n, --max-new-tokens, --temperature, --top-p
    if args.temperature == 0 and args.n > 1:
        raise ConfigError("--n > 1 needs --temperature > 0 (greedy samples are identical)")
    if any(k < 1 or k > args.n for k in args.k or []):
        raise ConfigError(f"every --k must be in [1, --n={args.n}], got {args.k}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    if args.max_prompt_length < 1:
        raise ConfigError(f"--max-prompt-length must be >= 1, got {args.max_prompt_length}")
    if args.preset and args.data in (None, "builtin"):
        raise ConfigError(f"--preset {args.preset} reads a file: pass it with --data PATH")
    if args.data not in (None, "builtin") and not args.data.startswith("tfds:"):
        require_source(args.data, "--data")
    if args.data is not None and args.data.startswith("tfds:"):
        from jaxrl_llm.data.sources import check_tfds

        check_tfds(args.data[5:], args.data_dir)
    check_mesh_flag(args.mesh)
    if args.out is not None:
        _check_out(args.out)
    _check_context(args)


def _check_out(out: Path) -> None:
    """`--out` must be a file path whose folder is, or can be made: checked before the model
    loads, not after the evaluation."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder: give a file path for the results JSON")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--out {out}: {parent} is a file, not a folder")
            return


def _check_context(args: argparse.Namespace) -> None:
    """A prompt and its response must fit the model's context (its config.json only)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.learner.run import check_context

    src = resolve_checkpoint(args.checkpoint, "--checkpoint")
    what = "--max-prompt-length + --max-new-tokens"  # the flags, not the training config's
    check_context(args.max_prompt_length + args.max_new_tokens, src, what)


def _prompts(args: argparse.Namespace, source, tokenizer):
    from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline

    fields = EVAL_PRESETS[args.preset].fields if args.preset else FieldMap()
    config = PipelineConfig(
        source=source, fields=fields, template=args.template,
        system_prompt=args.system_prompt, max_prompt_length=args.max_prompt_length,
        global_batch_size=64, num_epochs=1, shuffle=False, drop_remainder=False,
    )  # fmt: skip
    return build_prompt_pipeline(config, tokenizer)


def _rows(got, correct: float) -> list[dict[str, Any]]:
    """One row per problem of a scored `Rollout`: its samples' texts, answers, and whether
    each solved it (`rewards.config.solved` against the run's `RewardConfig.correct`)."""
    from jaxrl_llm.rewards import extract_answer
    from jaxrl_llm.rewards.config import solved

    G, out = got.group_size, []
    ok = solved(got.scores, correct).tolist()
    for p, pid in enumerate(got.prompt_ids):
        texts = [c.text for c in got.completions[p * G : (p + 1) * G]]
        out.append({
            "id": pid,
            "answer": got.answers[p * G],
            "correct": ok[p * G : (p + 1) * G],
            "answers": [extract_answer(t) for t in texts],
            "texts": texts,
        })  # fmt: skip
    return out


def _summary(rows: list[dict[str, Any]], n: int, ks: list[int]) -> dict[str, Any]:
    """pass@1, pass@k and maj@k over `rows`. maj@k: the first k samples' extracted answers
    vote (`metrics.pass_at_k.majority_correct`): the solved ones for the truth, the others
    grouped by `rewards.answers_equivalent` (so 7, 7.0 and \\frac{14}{2} are one answer)."""
    from jaxrl_llm.rewards.verifiable import answers_equivalent

    result: dict[str, Any] = {"problems": len(rows), "n": n}
    result["pass@1"] = float(np.mean([np.mean(r["correct"]) for r in rows]))
    # Each sample's vote is classed once for every k (`majority_correct_at`).
    maj = np.array([majority_correct_at(r["answers"], r["correct"], ks, answers_equivalent)
                    for r in rows]).reshape(len(rows), len(ks))  # fmt: skip
    for j, k in enumerate(ks):
        result[f"pass@{k}"] = float(np.mean([pass_at_k(n, sum(r["correct"]), k) for r in rows]))
        result[f"maj@{k}"] = float(np.mean(maj[:, j]))
    return result


@contextlib.contextmanager
def _source(args: argparse.Namespace) -> Iterator[SourceConfig]:
    """Where `--data` is read from. The built-in set (`--data builtin` or none) is written to a
    temporary folder of this call's own, removed when the `with` ends, so evals running at once
    (or with different `--limit`s) never read each other's file."""
    if args.data not in (None, "builtin"):
        split = args.split or (EVAL_PRESETS[args.preset].split if args.preset else "test")
        if args.data.startswith("tfds:"):
            yield SourceConfig(args.data[5:], format="tfds", split=split, data_dir=args.data_dir)
        else:
            yield SourceConfig(args.data, split=split)
        return
    from jaxrl_llm.data.tasks import arithmetic

    # The held-out side of the task's fixed partition: never seen in SFT or RL training.
    problems = arithmetic.generate_problems(
        args.limit or 200, seed=1_000_003, id_prefix="val", split="val"
    )
    with tempfile.TemporaryDirectory(prefix="jaxrl_eval_") as folder:
        out = Path(folder) / "builtin_val.jsonl"
        yield SourceConfig(str(arithmetic.write_jsonl(problems, out)))


def main(args: argparse.Namespace) -> int:
    result = evaluate(args)
    width = max(len(k) for k in result)
    for k, v in result.items():
        print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0
