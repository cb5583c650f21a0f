"""`jaxrl-llm eval`: pass@1, pass@k (unbiased) and maj@k of a checkpoint on a prompt set.

pass@k is the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of
which c are correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over problems.
maj@k: the most frequent extracted answer among the first k samples (ties: the first seen)
is scored against the ground truth.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c of them correct (k <= n)."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_answer(answers: list[str | None]) -> str | None:
    votes = collections.Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="builtin", help="HF folder or 'builtin'")
    parser.add_argument("--data", default=None, help="jsonl/json/parquet, tfds:NAME, or builtin")
    parser.add_argument("--data-dir", default=None, help="TFDS data_dir")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="first N problems")
    parser.add_argument("--template", default="chat")
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--tool", choices=("none", "python"), default="none")
    parser.add_argument("--n", type=int, default=1, help="samples per problem")
    parser.add_argument("--k", type=int, nargs="*", default=None, help="k values (default n)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write results JSON here")


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.data.examples import FieldMap
    from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
    from jaxrl_llm.models import from_pretrained, load_tokenizer
    from jaxrl_llm.rewards import extract_answer, get_reward
    from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams

    if args.temperature == 0 and args.n > 1:
        raise ValueError("--n > 1 needs --temperature > 0 (greedy samples are identical)")
    if any(k < 1 or k > args.n for k in args.k or []):
        raise ValueError(f"every --k must be in [1, --n={args.n}], got {args.k}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    src = resolve_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(src)
    model = from_pretrained(src)
    source = _source(args)
    pipe = build_prompt_pipeline(
        PipelineConfig(
            source=source,
            fields=FieldMap(),
            template=args.template,
            system_prompt=args.system_prompt,
            max_prompt_length=args.max_prompt_length,
            global_batch_size=64,
            num_epochs=1,
            shuffle=False,
            drop_remainder=False,
        ),
        tokenizer,
    )
    engine = Engine(
        model,
        max_concurrent_decodes=64,
        max_cache_length=args.max_prompt_length + args.max_new_tokens + 1,
        max_prefill_length=args.max_prompt_length,
        tokenizer=tokenizer,
    )
    driver = RolloutDriver(engine, tokenizer)
    tool = None
    stop: tuple[str, ...] = ()
    if args.tool == "python":
        from jaxrl_llm.tools import PythonTool

        tool = PythonTool()
        stop = tool.stop_strings
    sampling = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=stop,
        n=args.n,
        seed=args.seed,
    )
    reward = get_reward("math", correct=1.0, incorrect=0.0)
    ks = sorted(set(args.k or [args.n]))
    rows = []
    for batch in pipe.iterator():
        prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(len(batch))]
        comps = driver.generate(prompts, sampling, tool=tool)
        for p in range(len(batch)):
            group = comps[p * args.n : (p + 1) * args.n]
            texts = [c.text for c in group]
            correct = [reward(t, batch.answers[p]) > 0 for t in texts]
            answers = [extract_answer(t) for t in texts]
            rows.append({"id": batch.ids[p], "answer": batch.answers[p], "correct": correct,
                         "answers": answers, "texts": texts})  # fmt: skip
            if args.limit and len(rows) >= args.limit:
                break
        if args.limit and len(rows) >= args.limit:
            break
    result: dict[str, Any] = {"checkpoint": str(src), "problems": len(rows), "n": args.n}
    result["pass@1"] = float(np.mean([np.mean(r["correct"]) for r in rows]))
    for k in ks:
        result[f"pass@{k}"] = float(
            np.mean([pass_at_k(args.n, sum(r["correct"]), k) for r in rows])
        )
        maj = [majority_answer(r["answers"][:k]) for r in rows]
        hits = [
            m is not None and reward(f"\\boxed{{{m}}}", r["answer"]) > 0 for m, r in zip(maj, rows)
        ]
        result[f"maj@{k}"] = float(np.mean(hits))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": result, "samples": rows}, indent=1))
    return result


def _source(args):
    from jaxrl_llm.data.sources import SourceConfig

    if args.data in (None, "builtin"):
        import tempfile

        from jaxrl_llm.data.tasks import arithmetic

        # The held-out side of the task's fixed partition: never seen in SFT or RL training.
        problems = arithmetic.generate_problems(
            args.limit or 200, seed=1_000_003, id_prefix="val", split="val"
        )
        out = Path(tempfile.gettempdir()) / "jaxrl_eval_builtin_val.jsonl"
        return SourceConfig(str(arithmetic.write_jsonl(problems, out)))
    if args.data.startswith("tfds:"):
        return SourceConfig(args.data[5:], format="tfds", split=args.split, data_dir=args.data_dir)
    return SourceConfig(args.data, split=args.split)


def main(args: argparse.Namespace) -> int:
    result = evaluate(args)
    width = max(len(k) for k in result)
    for k, v in result.items():
        print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0
