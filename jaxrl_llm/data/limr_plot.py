"""The LIMR figure: the mean accuracy curve with a few selected and rejected prompts' curves.

Kept apart from ``limr`` so that scoring and selection do not import matplotlib.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from jaxrl_llm.data.limr import LimScores, load_scores


def plot_lim_curves(
    scores: LimScores | str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    threshold: float,
    n_examples: int = 3,
    seed: int = 0,
) -> Path:
    """Draws the mean curve (black) and ``n_examples`` selected (score >= threshold, green)
    and rejected (red) prompts' accuracy curves, chosen at random by ``seed``; writes a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not isinstance(scores, LimScores):
        scores = load_scores(scores)
    rng = np.random.default_rng(seed)
    epochs = np.arange(1, scores.epochs + 1)
    selected = np.flatnonzero(scores.scores >= threshold)
    rejected = np.flatnonzero(scores.scores < threshold)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for indices, color, label in (
        (selected, "tab:green", "selected"),
        (rejected, "tab:red", "rejected"),
    ):
        shown = rng.choice(indices, size=min(n_examples, len(indices)), replace=False)
        for k, i in enumerate(sorted(shown)):
            ax.plot(
                epochs,
                scores.accuracy[i],
                color=color,
                alpha=0.6,
                marker=".",
                label=label if k == 0 else None,
            )
    ax.plot(epochs, scores.mean_curve, color="black", linewidth=2.5, label="mean curve")
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"LIM: {len(selected)} of {len(scores.ids)} prompts with score >= {threshold:g}")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
