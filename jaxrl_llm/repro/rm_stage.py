"""The reward-model miniature's preparation and its reward table: one tiny reward model
trained from preference pairs (`jaxrl-llm rm`, ``rm_tiny.gin``), then GRPO against it.

Both arms run ``rm_grpo_tiny.gin`` (grpo_tiny's task and settings) and score every step's
samples with both rewards; only the weights differ: the "rm" arm trains on the RM's score
alone (the math rule at weight 0: logged as ``reward/math/mean``, never trained on), the
"rule" arm on the math rule alone (the RM at weight 0: logged as ``reward/rm:hf/mean``).
Validation is the math rule in both (``RLConfig.val_reward``), so the runner's
``val/test_score`` is held-out answer correctness whatever the arm trained on.

A run that finds a reward model trained with the same settings in its output folder
(``rm/prepared.json``) reuses it. ``python -m jaxrl_llm.repro.rm_stage OUT`` reads the
runs of ``OUT/results.json`` and writes ``OUT/rewards.md`` (each reward at the start and
end of training, per arm) and ``OUT/rewards.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.config import resolve_gin_file
from jaxrl_llm.repro import stats
from jaxrl_llm.repro.specs import PREPARED, Prepared, PrepOptions, finished_preparation

RM_GIN = "rm_tiny.gin"
RM_KEY = "reward/rm:hf/mean"  # the RM's score of a step's samples (`metric_names`: "rm:hf")
RULE_KEY = "reward/math/mean"  # the math rule's score of a step's samples
TOOL_KEY = "env/tool_calls/mean"  # Python tool calls per sample of a step
VAL_KEY = "val/test_score"
KEYS = ("rm", "rule", "tool")  # reward_curves' per-step series the table reports
EDGE = 3  # steps averaged for a reward's "start" (the first) and "end" (the last)


def rm_run(params: list[str]) -> dict[str, float]:
    """One `jaxrl-llm rm` with ``rm_tiny.gin`` in this process; returns its last metrics."""
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.reward_training import RMConfig, run_rm

    parse_gin([RM_GIN], params)
    return run_rm(RMConfig())


def prepare_rm(opts: PrepOptions) -> Prepared:
    """Trains the reward model (or reuses one trained with the same settings in OUT/rm),
    records its held-out pair accuracy, and points each arm's rewards at it."""
    out = opts.out_dir / "rm"
    params = [f"RMConfig.out_dir = '{out}'"]
    if opts.prep_steps is not None:
        params.append(f"RMConfig.steps = {opts.prep_steps}")
    signature = _signature(params)
    notes = finished_preparation(out, signature)
    if notes is None:
        t0 = time.perf_counter()
        last = rm_run(params)
        notes = {
            "rm_steps": int(last["step"]),
            "rm_val_accuracy": round(float(last["val/accuracy"]), 4),
            "rm_val_loss": round(float(last["val/loss"]), 4),
            "rm_s": round(time.perf_counter() - t0, 1),
        }
        (out / PREPARED).write_text(json.dumps({"signature": signature, **notes}) + "\n")
    rm = f"rm:{out / 'hf'}"
    return Prepared(
        arm_params={
            "rm": (f"RewardConfig.weights = {{'{rm}': 1.0, 'math': 0.0}}",),
            "rule": (f"RewardConfig.weights = {{'math': 1.0, '{rm}': 0.0}}",),
        },
        notes={"reward_model": rm, **notes},
    )


def _signature(params: list[str]) -> str:
    """What decides the RM besides the code: its gin file and the bindings (steps among them)."""
    h = hashlib.sha256()
    for part in (resolve_gin_file(RM_GIN).read_bytes(), "\n".join(params).encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def reward_curves(run_dir: str | Path) -> dict[str, list[float]]:
    """One run's per-step RM and rule scores of its training samples, and its validation."""
    from jaxrl_llm.metrics.writer import read_metrics

    records = read_metrics(run_dir)
    train = [r for r in records if RM_KEY in r]
    val = [r for r in records if VAL_KEY in r]
    return {
        "steps": [int(r["step"]) for r in train],
        "rm": [float(r[RM_KEY]) for r in train],
        "rule": [float(r[RULE_KEY]) for r in train],
        "tool": [float(r.get(TOOL_KEY, np.nan)) for r in train],
        "val_steps": [int(r["step"]) for r in val],
        "val": [float(r[VAL_KEY]) for r in val],
    }


def _edges(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values[:EDGE])), float(np.mean(values[-EDGE:]))


def reward_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per arm: each reward's start (first `EDGE` steps' mean), end (last `EDGE` steps'),
    and end - start, as mean and interval over seeds, from the runs of `result`."""
    out: dict[str, Any] = {}
    for name, arm in result["arms"].items():
        curves = [reward_curves(run["run_dir"]) for run in arm["runs"]]
        row: dict[str, Any] = {"seeds": [run["seed"] for run in arm["runs"]]}
        for key in KEYS:
            edges = [_edges(c[key]) for c in curves]
            for i, what in enumerate(("start", "end")):
                row[f"{key}_{what}"] = stats.mean_interval([e[i] for e in edges]).__dict__
            row[f"{key}_change"] = stats.mean_interval([e[1] - e[0] for e in edges]).__dict__
        row["curves"] = curves
        out[name] = row
    return out


def paired_ends(summary: dict[str, Any], a: str, b: str) -> dict[str, dict[str, float]]:
    """Per series, arm `a`'s end minus arm `b`'s, seed by seed: a seed's arms draw the same
    prompts at every step, so the pairing takes out the swing of the scores from one batch
    of prompts to the next (which moves the RM's score more than training does)."""
    pairs = list(zip(summary[a]["curves"], summary[b]["curves"], strict=True))
    return {
        key: stats.mean_interval(
            [float(np.mean(x[key][-EDGE:]) - np.mean(y[key][-EDGE:])) for x, y in pairs]
        ).__dict__
        for key in KEYS
    }


def _iv(iv: dict[str, float], digits: int = 3) -> str:
    if np.isnan(iv["low"]):
        return f"{iv['mean']:.{digits}f}"
    return f"{iv['mean']:.{digits}f} [{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


def reward_table(summary: dict[str, Any], paired: dict[str, Any] | None = None) -> str:
    """The markdown table of each arm's training samples: RM score, rule score and tool
    calls per sample, start -> end and the change."""
    lines = [
        f"Training samples (64 a step), mean over seeds; start: mean of the first {EDGE} "
        f"steps, end: of the last {EDGE}; change: end - start [95% bootstrap interval]:",
        "",
        "| arm | RM score | RM change | rule score | rule change | tool calls per sample "
        "| tool change |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary.items():
        cells = []
        for k in KEYS:
            start, end = row[f"{k}_start"]["mean"], row[f"{k}_end"]["mean"]
            cells += [f"{start:.3f} -> {end:.3f}", _iv(row[f"{k}_change"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for pair, diffs in (paired or {}).items():
        cells = [f"end: {_iv(diffs[k])}" for k in KEYS]
        lines.append(f"| {pair}, paired by seed | {cells[0]} | | {cells[1]} | | {cells[2]} | |")
    return "\n".join(lines) + "\n"


def plot_rewards(summary: dict[str, Any], path: Path) -> None:
    """Four panels over steps, each arm's seeds thin and their mean thick: the RM's score,
    the rule's score and the tool calls of the training samples, held-out rule accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("rm", "steps", "RM score (train samples)"),
              ("rule", "steps", "rule score (train samples)"),
              ("tool", "steps", "tool calls per sample (train)"),
              ("val", "val_steps", "held-out rule accuracy (greedy)"))  # fmt: skip
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, (key, steps_key, title) in zip(axes, panels, strict=True):
        for i, (name, row) in enumerate(summary.items()):
            color = f"C{i}"
            curves = row["curves"]
            for c in curves:
                ax.plot(c[steps_key], c[key], color=color, alpha=0.25, lw=0.8)
            mean = np.mean([c[key] for c in curves], axis=0)
            ax.plot(curves[0][steps_key], mean, color=color, lw=2, label=f"{name} (mean)")
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="a `jaxrl-llm repro rm` output folder (its results.json)")
    parser.add_argument(
        "--figure", default=None, help="the figure's path (default OUT/rewards.png)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    result = json.loads((out / "results.json").read_text())
    summary = reward_summary(result)
    pairs = dict.fromkeys((c["a"], c["b"]) for c in result["comparisons"])
    paired = {f"{a} - {b}": paired_ends(summary, a, b) for a, b in pairs}
    (out / "rewards.json").write_text(json.dumps({**summary, "paired": paired}, indent=1) + "\n")
    table = reward_table(summary, paired)
    (out / "rewards.md").write_text(table)
    plot_rewards(summary, Path(args.figure) if args.figure else out / "rewards.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
