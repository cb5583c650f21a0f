"""`jaxrl-llm train` (RL) and `jaxrl-llm sft`: parse gin flags, build the config, run."""

from __future__ import annotations

import argparse
import json

from jaxrl_llm.config import add_gin_arguments, parse_gin, write_resolved_config

DEFAULT_TRAIN_GIN = "grpo_tiny.gin"


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    add_gin_arguments(parser)
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest complete checkpoint"
    )


def train_main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.learner.rl_loop import run_rl
    from jaxrl_llm.sharding import initialize_distributed

    initialize_distributed()
    parse_gin(args.gin_file or [DEFAULT_TRAIN_GIN], args.gin_param)
    cfg = RLConfig()
    records = run_rl(cfg, resume=args.resume)
    last = records[-1] if records else {}
    print(
        json.dumps(
            {k: v for k, v in last.items() if k.startswith(("step", "val/", "critic/score"))}
        )
    )
    return 0


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    add_gin_arguments(parser)


def sft_main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.sft import SFTConfig, run_sft

    parse_gin(args.gin_file, args.gin_param)
    cfg = SFTConfig()
    write_resolved_config(cfg.out_dir)
    print(json.dumps(run_sft(cfg)))
    return 0
