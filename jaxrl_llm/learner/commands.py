"""`jaxrl-llm sft`: supervised fine-tuning from gin configs."""

from __future__ import annotations

import argparse
import json

from jaxrl_llm.config import add_gin_arguments, parse_gin, write_resolved_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_gin_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.sft import SFTConfig, run_sft

    parse_gin(args.gin_file, args.gin_param)
    cfg = SFTConfig()
    write_resolved_config(cfg.out_dir)
    print(json.dumps(run_sft(cfg)))
    return 0
