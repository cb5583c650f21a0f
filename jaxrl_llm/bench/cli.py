"""`jaxrl-llm bench SUITE`: one parser for every suite, then the suite's own `main(args)`.

Suites: `rollout` (engine vs HF `generate`), `train` (policy step vs a PyTorch forward +
backward), `rl-step` (one GRPO step by phase vs its kernels alone), `weight-sync` (the
weights moved to a sampler's own devices vs the read bandwidth). Each prints one JSON object
with its same-run baselines and the machine's ceilings (`bench.machine`). Every suite runs with
JAX's persistent compilation cache off (`host.compile_cache`: false), so a compile time is
XLA's own, not a load from an earlier run's cache.
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


# Flags that count something, and the least each may be (a sequence of one token has no
# next token to train on). `--rollout-devices 0` means the default, half the devices.
AT_LEAST = {"batch": 1, "prompt_len": 1, "new_tokens": 1, "steps_per_call": 1, "repeats": 1,
            "prompts": 1, "seq_len": 2, "min_response": 1, "steps": 1,
            "rollout_devices": 0}  # fmt: skip


def check_flags(args: argparse.Namespace) -> None:
    """Each counting flag in its range, or a `ConfigError` naming it, before anything loads
    (`--repeats 0` would report the compiling run, `--batch 0` fail deep in the engine)."""
    from jaxrl_llm.config_checks import ConfigError

    for name, least in AT_LEAST.items():
        value = getattr(args, name)
        if value < least:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} = {value}: expected an integer >= {least}")
    if args.max_response < args.min_response:
        raise ConfigError(
            f"--max-response = {args.max_response}: expected an integer >= --min-response "
            f"({args.min_response})"
        )


def main(args: argparse.Namespace) -> int:
    """The suite's `main(args)`, with the persistent compile cache off (the compile times
    the suites report are XLA's, not a load from disk: `clock.persistent_cache_off`)."""
    from jaxrl_llm.bench.clock import persistent_cache_off

    check_flags(args)
    module = SUITES[args.suite]
    if args.suite == "rollout" and args.mixed:
        module = "jaxrl_llm.bench.rollout_mixed"
    if args.suite == "train" and args.packed:
        module = "jaxrl_llm.bench.train_packed"
    with persistent_cache_off():
        return importlib.import_module(module).main(args)
