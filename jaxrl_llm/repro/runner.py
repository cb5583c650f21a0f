"""Runs a reproduction: its preparation, then every arm over every seed, in this process.

Each run is `jaxrl-llm train` with the arm's gin files plus the runner's bindings: the seed
(``RLConfig.seed`` and ``DataConfig.seed``, so arm A and arm B of seed s share data order,
validation set and sampling state), the step count, no checkpoints. Runs share one process so
JAX starts once; gin is cleared and re-parsed for each. The result is one JSON-ready record
(``RepResult``): per-seed curves, and per arm the final validation score's mean and interval,
and the paired comparisons the reproduction names.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_llm.repro import stats
from jaxrl_llm.repro.specs import Prepared, PrepOptions, Repro

log = logging.getLogger(__name__)

VAL_KEY = "val/test_score"
TRAIN_KEY = "critic/score/mean"
METRICS = ("final", "mean", "gain")


@dataclasses.dataclass(frozen=True)
class RunCurve:
    """One (arm, seed) run: validation accuracy at each evaluated step, train score per step."""

    arm: str
    seed: int
    val_steps: tuple[int, ...]
    val_scores: tuple[float, ...]
    train_scores: tuple[float, ...]
    wall_s: float
    run_dir: str

    def metric(self, name: str) -> float:
        """``final``: validation accuracy at the last step; ``mean``: its mean over the
        evaluated steps after step 0 (the area under the curve: how fast an arm learns, which
        a final score misses when every arm ends saturated); ``gain``: final minus step 0,
        what RL added to where the arm started."""
        if name not in METRICS:
            raise ValueError(f"metric {name!r} is not one of {METRICS}")
        later = [v for s, v in zip(self.val_steps, self.val_scores) if s > 0]
        if not later:
            raise ValueError(f"run {self.run_dir} recorded no {VAL_KEY} after step 0")
        if name == "gain":
            if self.val_steps[0] != 0:
                raise ValueError(f"run {self.run_dir} has no step-0 {VAL_KEY} to gain from")
            return later[-1] - self.val_scores[0]
        return later[-1] if name == "final" else float(sum(later) / len(later))


def train_run(gin_files: Sequence[str], params: Sequence[str], run_dir: Path) -> list[dict]:
    """One `jaxrl-llm train` in this process; returns its metric records."""
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.learner.rl_loop import run_rl

    parse_gin(list(gin_files), list(params))
    cfg = dataclasses.replace(RLConfig(), run_dir=str(run_dir))
    return run_rl(cfg)


def curve_of(arm: str, seed: int, records: list[dict], wall_s: float, run_dir: Path) -> RunCurve:
    val = [(r["step"], float(r[VAL_KEY])) for r in records if VAL_KEY in r]
    train = [float(r[TRAIN_KEY]) for r in records if TRAIN_KEY in r]
    return RunCurve(
        arm=arm,
        seed=seed,
        val_steps=tuple(s for s, _ in val),
        val_scores=tuple(v for _, v in val),
        train_scores=tuple(train),
        wall_s=round(wall_s, 1),
        run_dir=str(run_dir),
    )


def seed_params(seed: int, steps: int | None) -> list[str]:
    """The bindings the runner adds to every arm: seed, steps, no checkpoints."""
    params = [f"RLConfig.seed = {seed}", f"DataConfig.seed = {seed}", "RLConfig.save_every = 0"]
    if steps is not None:
        params.append(f"RLConfig.steps = {steps}")
    return params


def check_gin_params(repro: Repro, gin_params: Sequence[str]) -> None:
    """Parse every arm's gin files with `gin_params` and build its `RLConfig`: a wrong name or
    value is a `ConfigError` now, not after the preparation's minutes of training."""
    import gin

    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig

    if not gin_params:
        return
    try:
        for arm in repro.arms:
            parse_gin(list(arm.gin_files), [*arm.gin_params, *gin_params])
            RLConfig()
    finally:
        gin.clear_config()


def run_repro(
    repro: Repro,
    *,
    seeds: Sequence[int],
    steps: int | None,
    out_dir: Path,
    prep_steps: int | None = None,
    gin_params: Sequence[str] = (),
) -> dict[str, Any]:
    """Prepares, runs every arm for every seed, writes ``out_dir/results.json``; returns it.
    `gin_params` are added to every RL run after the arm's and the runner's own bindings
    (so they win), checked against every arm before anything trains."""
    check_gin_params(repro, gin_params)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    prepare = repro.prepare_fn()
    prepared = prepare(PrepOptions(out_dir, tuple(seeds), prep_steps)) if prepare else Prepared()
    prep_s = time.perf_counter() - t0
    curves: list[RunCurve] = []
    for seed in seeds:  # seed-major: a partial run still holds complete pairs
        for arm in repro.arms:
            run_dir = out_dir / "runs" / f"{arm.name}-seed{seed}"
            params = [
                *arm.gin_params,
                *prepared.params(arm.name, seed),
                *seed_params(seed, steps),
                *gin_params,
            ]
            log.info("repro %s: arm %s seed %d -> %s", repro.name, arm.name, seed, run_dir)
            t = time.perf_counter()
            records = train_run(arm.gin_files, params, run_dir)
            curves.append(curve_of(arm.name, seed, records, time.perf_counter() - t, run_dir))
    result = summarise(repro, curves, prepared, steps=steps, gin_params=gin_params)
    result["timing"] = {
        "prepare_s": round(prep_s, 1),
        "total_s": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def summarise(
    repro: Repro,
    curves: Sequence[RunCurve],
    prepared: Prepared,
    *,
    steps: int | None,
    gin_params: Sequence[str] = (),
) -> dict[str, Any]:
    """Per-arm intervals of each metric and the paired comparisons, as a JSON-ready dict."""
    by_arm = {
        arm.name: sorted((c for c in curves if c.arm == arm.name), key=lambda c: c.seed)
        for arm in repro.arms
    }
    if len({tuple(c.seed for c in cs) for cs in by_arm.values()}) != 1:
        raise ValueError(
            f"arms ran different seeds: { ({a: [c.seed for c in cs] for a, cs in by_arm.items()}) }"
        )
    values = {(a, m): [c.metric(m) for c in cs] for a, cs in by_arm.items() for m in METRICS}
    arms = {
        arm.name: {
            "description": arm.description,
            "gin_files": list(arm.gin_files),
            **{
                f"{m}_val": dataclasses.asdict(stats.mean_interval(values[arm.name, m]))
                for m in METRICS
            },
            "wall_s_per_run": [c.wall_s for c in by_arm[arm.name]],
            "runs": [dataclasses.asdict(c) for c in by_arm[arm.name]],
        }
        for arm in repro.arms
    }
    comparisons = []
    for m in METRICS:
        for a, b in repro.comparisons:
            cmp = stats.paired_comparison(a, values[a, m], b, values[b, m])
            row = {"metric": m, **dataclasses.asdict(cmp), "significant": cmp.significant}
            comparisons.append(row)
    return {
        "repro": repro.name,
        "claim": repro.claim,
        "metrics": {
            "final": f"{VAL_KEY} (greedy validation accuracy) at the last step",
            "mean": f"{VAL_KEY} averaged over the evaluated steps after step 0",
            "gain": f"{VAL_KEY} at the last step minus at step 0",
        },
        "steps": steps,
        "gin_params": list(gin_params),  # `--gin_param`: bindings every RL run added
        "seeds": sorted({c.seed for c in curves}),
        "arms": arms,
        "comparisons": comparisons,
        "prepared": dict(prepared.notes),
    }


def resummarise(repro: Repro, result: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` summarised again from its per-seed curves (no training): for a
    report whose statistics changed after the runs, or a partial run's curves."""
    curves = [
        RunCurve(
            arm=str(run["arm"]),
            seed=int(run["seed"]),
            val_steps=tuple(int(s) for s in run["val_steps"]),
            val_scores=tuple(float(v) for v in run["val_scores"]),
            train_scores=tuple(float(v) for v in run["train_scores"]),
            wall_s=float(run["wall_s"]),
            run_dir=str(run["run_dir"]),
        )
        for arm in result["arms"].values()
        for run in arm["runs"]
    ]
    prepared = Prepared(notes=result.get("prepared", {}))
    gin_params = result.get("gin_params", [])
    out = summarise(repro, curves, prepared, steps=result.get("steps"), gin_params=gin_params)
    return {**out, "timing": result.get("timing", {})}
