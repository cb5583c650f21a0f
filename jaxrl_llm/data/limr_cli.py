"""`jaxrl-llm limr score|select`: LIMR's scoring and selection from the command line.

    jaxrl-llm limr score --run runs/full --steps-per-epoch 8 --epochs 21
        reads runs/full/samples/step_*.jsonl, writes runs/full/lim_scores.json and the
        curves plot runs/full/lim_curves.png (`--out`, `--plot` to change them). The run
        must have recorded all 21 x 8 steps (batches drawn from the data: more than the RL
        steps with dynamic sampling); when its records end earlier the command says how many
        whole epochs it holds.
    jaxrl-llm limr select --scores runs/full/lim_scores.json --data train.jsonl \\
        --threshold 0.6 --out lim.jsonl
        writes the prompts with score >= 0.6, in train.jsonl's own format.
    jaxrl-llm limr select --scores ... --data train.jsonl --threshold 0.6 \\
        --random --seed 0 --out rand.jsonl
        writes the RAND baseline instead: prompts drawn at random from the whole data file,
        as many as the LIM subset at that threshold has (`--random N` gives the size).

Each command prints one JSON line saying what it wrote. A command that cannot do what it was
asked (records that end early, a missing run or scores file, a subset that would be empty,
a random subset larger than the data, an `--out` that is the `--data` file or a folder)
writes nothing and ends with one line saying why (`ConfigError`, exit status 2). The work is done by
`jaxrl_llm.data.limr` (`score_run`), `jaxrl_llm.data.limr_select` (`select`,
`random_subset`, `lim_subset_size`) and `jaxrl_llm.data.limr_plot.plot_lim_curves`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxrl_llm.data import limr, limr_select
from jaxrl_llm.data.examples import DEFAULT_FIELDS, FieldMap

DEFAULT_THRESHOLD = 0.6
PLOT_FILE = "lim_curves.png"
_SAME_SIZE = -1  # `--random` without N: the LIM subset's size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="limr_command", metavar="{score,select}", required=True)

    score = sub.add_parser("score", help="LIM scores from a run's samples/step_N.jsonl files")
    score.add_argument("--run", required=True, help="run directory holding samples/")
    score.add_argument(
        "--steps-per-epoch",
        type=int,
        required=True,
        help="batches per pass over the data: usable prompts // DataConfig.prompts_per_step "
        "(the RL steps per epoch without dynamic sampling)",
    )
    score.add_argument("--epochs", type=int, required=True, help="epochs to score (LIMR: 21)")
    score.add_argument(
        "--correct-reward",
        type=float,
        default=1.0,
        help="a sample is correct at this reward or more (RewardConfig.correct; default 1.0)",
    )
    score.add_argument("--first-step", type=int, default=1, help="number of the first step")
    score.add_argument("--out", help=f"scores file (default RUN/{limr.SCORES_FILE})")
    score.add_argument("--plot", help=f"curves PNG (default {PLOT_FILE} beside the scores)")
    score.add_argument("--no-plot", action="store_true", help="skip the plot")
    score.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"selection threshold the plot colours by (default {DEFAULT_THRESHOLD})",
    )

    select = sub.add_parser("select", help="write the LIM subset (or a RAND baseline)")
    select.add_argument("--scores", required=True, help="scores file from `limr score`")
    select.add_argument(
        "--data", required=True, help="the run's training data (jsonl/json/parquet)"
    )
    select.add_argument("--out", required=True, help="where to write the subset (same format)")
    select.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"keep prompts with score >= THRESHOLD (default {DEFAULT_THRESHOLD})",
    )
    select.add_argument(
        "--random",
        type=int,
        nargs="?",
        const=_SAME_SIZE,
        default=None,
        metavar="N",
        help="write a random subset of the data instead (LIMR's RAND baseline) of N prompts; "
        "without N, as many as the LIM subset at --threshold",
    )
    select.add_argument("--seed", type=int, default=0, help="seed of the random subset")
    select.add_argument("--id-key", help="the data's id field, when it is not 'id'")
    select.add_argument("--format", default="auto", help="the data's format (default: by suffix)")


def _fields(id_key: str | None) -> FieldMap:
    return FieldMap(id=(id_key,)) if id_key else DEFAULT_FIELDS


def run_score(args: argparse.Namespace) -> dict:
    run = Path(args.run)
    out = Path(args.out) if args.out else run / limr.SCORES_FILE
    result = limr.score_run(
        run,
        args.steps_per_epoch,
        args.epochs,
        correct_reward=args.correct_reward,
        first_step=args.first_step,
        out_path=out,
    )
    report = {
        "scores": str(out),
        "prompts": len(result.ids),
        "dropped": len(result.dropped),
        "backfilled": result.backfilled,
        "threshold": args.threshold,
        "selected": int((result.scores >= args.threshold).sum()),
    }
    if not args.no_plot:
        from jaxrl_llm.data.limr_plot import plot_lim_curves

        plot = Path(args.plot) if args.plot else out.parent / PLOT_FILE
        report["plot"] = str(plot_lim_curves(result, plot, threshold=args.threshold))
    return report


def run_select(args: argparse.Namespace) -> dict:
    fields = _fields(args.id_key)
    limr_select.check_out_path(args.data, args.out)
    scores = limr.load_scores(args.scores)
    report: dict = {"out": args.out, "threshold": args.threshold}
    if args.random is None:
        report["mode"] = "lim"
        report["prompts"] = limr_select.select(
            scores, args.data, args.threshold, args.out, fields=fields, data_format=args.format
        )
        return report
    n = args.random
    if n == _SAME_SIZE:
        n = limr_select.lim_subset_size(
            scores, args.data, args.threshold, fields=fields, data_format=args.format
        )
    report.update(mode="random", seed=args.seed)
    report["prompts"] = limr_select.random_subset(
        args.data, n, args.seed, args.out, fields=fields, data_format=args.format
    )
    return report


def main(args: argparse.Namespace) -> int:
    run = {"score": run_score, "select": run_select}[args.limr_command]
    print(json.dumps(run(args)))
    return 0
