"""`jaxrl-llm plot`: the curves researchers read, from one or more runs' `metrics.jsonl`.

`write_dashboard(run_dirs, out_dir)` writes `dashboard.png` (every panel) and one
`dashboard_<group>.png` per metric group: reward and validation score; response length
and clip ratio; pg_loss, KL and entropy; clip fraction and grad norm; critic (PPO); tool
use (ToRL); timings. A panel none of whose metrics any run logged is left out, not drawn
empty. Several runs overlay in one colour each, labelled by run directory name (widened
by parent folders where names repeat: `x/a/run`, `y/a/run`).

Drawing uses matplotlib's Agg canvas on `Figure` objects (no pyplot, no GUI, no global
state), so the trainer can refresh the dashboard from its loop; each local PNG is written
to a temporary name and renamed, so a viewer never sees half a file. Run and output folders
may be `gs://` paths (`etils.epath`); there each PNG is one object, written whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from etils import epath

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.metrics.writer import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure, SubFigure

log = logging.getLogger(__name__)

DASHBOARD = "dashboard.png"
METRICS = "metrics.jsonl"
COLUMNS = 3  # panels per dashboard row


@dataclasses.dataclass(frozen=True)
class Panel:
    """One axes: a title and (metric key, legend label) pairs sharing its y scale."""

    title: str
    series: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Group:
    """A row of panels; also written alone as `dashboard_<name>.png`."""

    name: str
    title: str
    panels: tuple[Panel, ...]


GROUPS: tuple[Group, ...] = (
    Group("reward", "Reward and validation score", (
        Panel("score", (("critic/score/mean", "train score"), ("val/reward/mean", "val reward"),
                        ("val/test_score", "val test score"))),
    )),
    Group("length", "Response length", (
        Panel("response length (tokens)", (("response_length/mean", "mean"),
                                           ("response_length/max", "max"))),
        Panel("clip ratio (truncated at the cap)", (("response_length/clip_ratio", "clip ratio"),)),
    )),
    Group("policy", "Policy loss, KL and entropy", (
        Panel("pg_loss", (("actor/pg_loss", "pg_loss"),)),
        Panel("KL", (("actor/kl_loss", "kl_loss"), ("actor/ppo_kl", "ppo_kl"))),
        Panel("entropy", (("actor/entropy", "entropy"),)),
    )),
    Group("clip", "Clip fraction and grad norm", (
        Panel("pg_clipfrac", (("actor/pg_clipfrac", "pg_clipfrac"),)),
        Panel("grad norm", (("actor/grad_norm", "actor"), ("critic/grad_norm", "critic"))),
    )),
    Group("critic", "Critic (PPO)", (
        Panel("vf_loss", (("critic/vf_loss", "vf_loss"),)),
        Panel("values and returns", (("critic/values/mean", "values"),
                                     ("critic/returns/mean", "returns"))),
    )),
    Group("tools", "Tool use (ToRL)", (
        Panel("tool calls per response", (("env/tool_calls/mean", "tool calls"),)),
        Panel("rates", (("env/code_success_rate", "code success"),
                        ("env/ratio_of_valid_action", "valid action"))),
    )),
    Group("timing", "Timings", (
        Panel("seconds", (("timing/step", "step"), ("timing/rollout", "rollout"),
                          ("timing/weight_sync", "weight sync"),
                          ("timing/experience", "experience"), ("timing/update", "update"),
                          ("timing/validate", "validate"))),
        Panel("throughput (tokens/s)", (("perf/tokens_per_s", "tokens/s"),)),
    )),
)  # fmt: skip

# Series logged only on some steps (evaluation): drawn with markers so lone points show.
SPARSE_PREFIXES = ("val/",)
LINESTYLES = ("-", "--", ":", "-.")

Series = tuple[np.ndarray, np.ndarray]  # steps, values (finite only)


class NoMetricsError(ConfigError, FileNotFoundError):
    """A folder given as a run directory has no metrics.jsonl."""


def load_series(run_dir: str | os.PathLike) -> dict[str, Series]:
    """Each metric of a run (its directory or its metrics.jsonl) as (steps, values),
    non-finite values ("nan"/"inf") dropped."""
    path = epath.Path(run_dir)
    if not (path / "metrics.jsonl").exists() and not path.is_file():
        raise NoMetricsError(f"no metrics.jsonl in {path}: not a training run's directory")
    points: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(path):  # records only: other lines skipped, with a warning
        step = record.get("step")
        if step is None:
            continue
        for key, value in record.items():
            try:
                f = float(value)
            except (TypeError, ValueError):
                continue
            if key != "step" and math.isfinite(f):
                points.setdefault(key, []).append((int(step), f))
    return {
        k: (np.array([s for s, _ in v]), np.array([f for _, f in v])) for k, v in points.items()
    }


def run_labels(run_dirs: list[epath.Path]) -> list[str]:
    """Legend labels, one per run and all different (runs are keyed by label): each run
    directory's name, widened by parent folders (`x/a/run`, `y/a/run`) until it differs
    from every other run's label; the full path, numbered, for a run given twice."""
    # A local path is resolved first, so "." is labelled by its folder's name; a run given
    # as its metrics.jsonl is labelled by its folder.
    dirs = [d.parent if d.name == METRICS else d for d in map(epath.Path, run_dirs)]
    full = [os.fspath(d if "://" in os.fspath(d) else d.resolve()) for d in dirs]
    parts = [p.rstrip("/").split("/") for p in full]
    labels = []
    for i, own in enumerate(parts):
        others = [p for j, p in enumerate(parts) if j != i]
        k = 1  # a k-part suffix that differs from another's differs at every longer k too
        while k < len(own) and any(p[-k:] == own[-k:] for p in others):
            k += 1
        labels.append(full[i] if k == len(own) else "/".join(own[-k:]))
    # The same folder given twice: the same data, but each keeps its line and legend entry.
    return [f"{lab} ({labels[:i].count(lab) + 1})" if labels.count(lab) > 1 else lab
            for i, lab in enumerate(labels)]  # fmt: skip


def build_figures(run_dirs: list[epath.Path], *, per_group: bool = True) -> dict[str, Figure]:
    """Figures by name: "dashboard" plus one per present group (see `GROUPS`).

    Panels whose metrics are absent from every run are dropped, and groups left with no
    panel; with nothing to draw the result is empty.
    """
    from matplotlib.figure import Figure

    runs = dict(zip(run_labels(run_dirs), (load_series(d) for d in run_dirs)))
    present = []
    for group in GROUPS:
        panels = tuple(
            p for p in group.panels if any(k in s for k, _ in p.series for s in runs.values())
        )
        if panels:
            present.append(dataclasses.replace(group, panels=panels))
    if not present:
        return {}
    figures: dict[str, Figure] = {}
    dash = Figure(figsize=(5.0 * COLUMNS, 3.4 * len(present)), layout="constrained")
    rows = dash.subfigures(len(present), 1, squeeze=False)[:, 0]
    for sub, group in zip(rows, present):
        _draw_group(sub, group, runs, columns=COLUMNS)
    figures["dashboard"] = dash
    for group in present if per_group else ():
        fig = Figure(figsize=(5.0 * len(group.panels), 3.6), layout="constrained")
        _draw_group(fig, group, runs, columns=len(group.panels))
        figures[group.name] = fig
    return figures


def write_dashboard(
    run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *, per_group: bool = True
) -> list[Path | epath.Path]:
    """Write `dashboard.png` and one `dashboard_<group>.png` per present group to out_dir.

    run_dirs: run directories (each holding `metrics.jsonl`) or their metrics.jsonl files;
      several runs overlay, one colour per run, labelled by directory name.
    per_group: also write the per-group PNGs (False halves the time: dashboard only).
    Returns the written paths, dashboard first; empty (and a logged warning) when no run
    has any plotted metric. Call on process 0 only; a few seconds on a busy 2-core CPU.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    dirs = [epath.Path(d) for d in run_dirs]
    figures = build_figures(dirs, per_group=per_group)
    if not figures:
        log.warning("no plottable metrics in %s; no dashboard written", run_dirs)
        return []
    remote = "://" in os.fspath(out_dir)
    # Local paths come back as pathlib paths, as before cloud folders were accepted.
    out = epath.Path(out_dir) if remote else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        path = out / (DASHBOARD if name == "dashboard" else f"dashboard_{name}.png")
        tmp = path if remote else path.with_name(f".{path.name}.tmp")
        FigureCanvasAgg(fig)  # explicit Agg canvas: never a GUI backend
        with tmp.open("wb") as f:
            fig.savefig(f, format="png", dpi=100)
        if not remote:
            tmp.replace(path)
        written.append(path)
    return written


def _draw_group(
    container: Figure | SubFigure, group: Group, runs: dict[str, dict[str, Series]], *,
    columns: int,
) -> None:  # fmt: skip
    container.suptitle(group.title, fontweight="bold")
    axes = container.subplots(1, columns, squeeze=False)[0]
    for ax, panel in zip(axes, group.panels):
        _draw_panel(ax, panel, runs)
    for ax in axes[len(group.panels) :]:
        ax.remove()


def _draw_panel(ax, panel: Panel, runs: dict[str, dict[str, Series]]) -> None:
    import matplotlib as mpl

    colors = mpl.color_sequences["tab10"]
    keys = [(k, lab) for k, lab in panel.series if any(k in s for s in runs.values())]
    one_run = len(runs) == 1
    for r, (run, series) in enumerate(runs.items()):
        for m, (key, label) in enumerate(keys):
            if key not in series:
                continue
            steps, values = series[key]
            sparse = key.startswith(SPARSE_PREFIXES) or len(steps) <= 20
            # One run: a colour per metric. Several: a colour per run, a line style per metric.
            color = colors[(m if one_run else r) % len(colors)]
            style = "-" if one_run else LINESTYLES[m % len(LINESTYLES)]
            name = label if one_run else (run if len(keys) == 1 else f"{run}: {label}")
            ax.plot(
                steps, values, style, color=color, label=name,
                marker="o" if sparse else None, markersize=4 if sparse else None,
            )  # fmt: skip
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if len(ax.get_lines()) > 1 or not one_run:
        ax.legend(fontsize=7)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", type=epath.Path, nargs="+", metavar="RUN_DIR",
                        help="run directories holding metrics.jsonl (or the metrics.jsonl "
                             "files); several overlay")  # fmt: skip
    parser.add_argument("--out", type=epath.Path, default=None,
                        help="output folder (default: the first RUN_DIR, or the folder of the "
                             "first file given)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    first = epath.Path(args.run_dirs[0])
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give the folder the PNGs go to")
    paths = write_dashboard(args.run_dirs, args.out or (first.parent if first.is_file() else first))
    for p in paths:
        print(p)
    return 0 if paths else 1
