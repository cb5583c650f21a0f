"""`jaxrl-llm repro torl|limr|search-r1|agent|rm`: every arm of a miniature reproduction over
N seeds.

Writes ``OUT/results.json`` (per-seed curves, per-arm intervals, paired comparisons),
``OUT/figure.png`` and ``OUT/summary.md`` (the tables docs/reproductions.md shows); LIMR also
``OUT/lim_curves.png`` (the scoring run's curves). A crashed run continues when the same command
runs again: finished runs are reused, and ``results.json`` is written after every complete seed
(``--report-only`` reports a partial one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.repro.specs import REPROS, get_repro, seed_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(REPROS), help="which reproduction")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 for every arm")
    parser.add_argument(
        "--steps", type=int, default=None, help="RL steps per run (default: the gin files')"
    )
    parser.add_argument(
        "--prep-steps",
        type=int,
        default=None,
        help="cap on the preparation's own training (LIMR scoring epochs' steps, SFT steps)",
    )
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="a gin binding for every arm's RL runs, after the arm's own (it wins), e.g. "
        "'RolloutConfig.n = 8'; repeatable; recorded in results.json",
    )
    parser.add_argument("--out", default=None, help="output folder (default runs/repro_<name>)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="no training: summarise OUT/results.json's curves again, redraw figure and tables",
    )


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.repro.report import markdown_tables, plot_result
    from jaxrl_llm.repro.runner import read_results, resummarise, run_repro

    for flag, value in (("--steps", args.steps), ("--prep-steps", args.prep_steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} = {value}: expected an integer >= 1")
    seeds = seed_list(args.seeds)
    repro = get_repro(args.name)
    out = Path(args.out or f"runs/repro_{args.name.replace('-', '_')}")
    if args.report_only:
        path = out / "results.json"
        result = resummarise(repro, read_results(path))
        path.write_text(json.dumps(result, indent=1) + "\n")
    else:
        result = run_repro(
            repro,
            seeds=seeds,
            steps=args.steps,
            out_dir=out,
            prep_steps=args.prep_steps,
            gin_params=args.gin_param,
        )
    plot_result(result, out / "figure.png")
    tables = markdown_tables(result)
    (out / "summary.md").write_text(tables)
    print(tables)
    print(json.dumps({"out": str(out), **result["timing"]}))
    return 0
