"""`jaxrl-llm bench SUITE`: one parser for every suite, then the suite's own `main(args)`.

Suites: `rollout` (engine vs HF `generate`), `train` (policy step vs a PyTorch forward +
backward), `rl-step` (one GRPO step by phase vs its kernels alone), `weight-sync` (the
weights moved to a sampler's own devices vs the read bandwidth). Each prints one JSON object
with its same-run baselines and the machine's ceilings (`bench.machine`).
"""

from __future__ import annotations

import argparse
import importlib

SUITES = {"rollout": "jaxrl_llm.bench.rollout", "train": "jaxrl_llm.bench.train",
          "rl-step": "jaxrl_llm.bench.rl_step",
          "weight-sync": "jaxrl_llm.bench.weight_sync"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl_llm.bench import rl_step, weight_sync

    parser.add_argument("suite", choices=list(SUITES))
    parser.add_argument("--checkpoint", default="builtin")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-hf", action="store_true", help="no transformers baseline")
    parser.add_argument(
        "--backend",
        choices=("jax", "vllm"),
        default="jax",
        help="rollout: 'vllm' also measures vLLM on the same checkpoint and shape; rl-step: "
        "the run's sampler (RolloutConfig.backend)",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="rollout: ToRL-shaped lengths (512-token prompts, n=8, 64-2048 "
        "new tokens each); engine only",
    )
    parser.add_argument("--prompts", type=int, default=8, help="rollout --mixed: prompts")
    parser.add_argument("--seq-len", type=int, default=256, help="train: tokens per sequence")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="train: the step's op time by source function; rollout: a decode call's, and the ops "
        "(kernels) it runs per decode step",
    )
    parser.add_argument(
        "--packed",
        action="store_true",
        help="train: RL-shaped lengths (--prompt-len, responses uniform in [--min-response, "
        "--max-response]); packed vs padded rows and a padded PyTorch baseline",
    )
    parser.add_argument("--min-response", type=int, default=64, help="train --packed")
    parser.add_argument("--max-response", type=int, default=2048, help="train --packed")
    rl_step.add_arguments(parser)  # --gin_file, --gin_param, --steps
    weight_sync.add_arguments(parser)  # --rollout-devices


def main(args: argparse.Namespace) -> int:
    module = SUITES[args.suite]
    if args.suite == "rollout" and args.mixed:
        module = "jaxrl_llm.bench.rollout_mixed"
    if args.suite == "train" and args.packed:
        module = "jaxrl_llm.bench.train_packed"
    return importlib.import_module(module).main(args)
