"""A reproduction's figure (mean and 95% bootstrap interval per arm over steps) and its
markdown tables (final score per arm; paired comparisons), from ``results.json``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.repro import stats


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def _interval_text(iv: dict[str, float]) -> str:
    if math.isnan(iv["low"]):
        return f"{_pct(iv['mean'])}% (one seed: no interval)"
    return f"{_pct(iv['mean'])}% [{_pct(iv['low'])}, {_pct(iv['high'])}]"


def markdown_tables(result: dict[str, Any]) -> str:
    """The per-arm table and the paired-comparison table the docs paste."""
    lines = [
        f"Greedy validation accuracy, mean over seeds {result['seeds']} [95% bootstrap "
        "interval]; final: at the last step; mean: averaged over the evaluated steps after 0; "
        "gain: final minus step 0 (points)"
        + "".join(f"; every run with `{p}`" for p in result.get("gin_params", []))
        + ":",
        "",
        "| arm | what it trains on | final val accuracy | mean val accuracy | gain | minutes "
        "per run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    if "partial" in result:  # written after each complete seed; the repro stopped before the last
        planned = result["partial"]["seeds_planned"]
        lines[:0] = [
            f"**Partial**: seeds {result['seeds']} of {planned} finished; rerun the same "
            "command to train the missing runs.",
            "",
        ]
    for name, arm in result["arms"].items():
        minutes = np.mean(arm["wall_s_per_run"]) / 60
        lines.append(
            f"| {name} | {arm['description']} | {_interval_text(arm['final_val'])} "
            f"| {_interval_text(arm['mean_val'])} "
            f"| {_interval_text(arm['gain_val']).replace('%', '')} | {minutes:.1f} |"
        )
    lines += [
        "",
        "| comparison | metric | mean difference (points) [95% interval] | permutation p "
        "(smallest possible) | interval excludes 0 |",
        "|---|---|---:|---:|---|",
    ]
    for c in result["comparisons"]:
        d = c["difference"]
        diff = _interval_text(d).replace("%", "")
        excludes = (
            "n/a" if math.isnan(d["low"]) else ("yes" if d["low"] > 0 or d["high"] < 0 else "no")
        )
        lines.append(
            f"| {c['a']} - {c['b']} | {c['metric']} | {diff} "
            f"| {c['p_value']:.3f} ({c['min_p_value']:.3f}) | {excludes} |"
        )
    return "\n".join(lines) + "\n"


def _band(curves: list[dict[str, Any]]) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """Mean and interval at the steps every seed evaluated."""
    steps = sorted(set.intersection(*(set(c["val_steps"]) for c in curves)))
    at = [[dict(zip(c["val_steps"], c["val_scores"]))[s] for c in curves] for s in steps]
    ivs = [stats.mean_interval(v) for v in at]
    return (
        steps,
        np.array([iv.mean for iv in ivs]),
        np.array([iv.low for iv in ivs]),
        np.array([iv.high for iv in ivs]),
    )


def plot_result(result: dict[str, Any], path: Path) -> Path:
    """Validation accuracy per arm: the seed mean as a line, its 95% interval shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for name, arm in result["arms"].items():
        steps, mean, low, high = _band(arm["runs"])
        (line,) = ax.plot(steps, 100 * mean, marker="o", label=f"{name} (n={len(arm['runs'])})")
        if not np.all(np.isnan(low)):
            ax.fill_between(steps, 100 * low, 100 * high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy val accuracy (%)")
    ax.set_title(f"{result['repro']}: mean over seeds, 95% bootstrap interval")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
