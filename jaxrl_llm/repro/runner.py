"""Runs a reproduction: its preparation, then every arm over every seed, in this process.

Each run is `jaxrl-llm train` with the arm's gin files plus the runner's bindings: the seed
(``RLConfig.seed`` and ``DataConfig.seed``, so arm A and arm B of seed s share data order,
validation set and sampling state), the step count, no checkpoints. Runs share one process so
JAX starts once; gin is cleared and re-parsed for each. The result is one JSON-ready record
(``RepResult``): per-seed curves, and per arm the final validation score's mean and interval,
and the paired comparisons the reproduction names.

A crashed reproduction continues: each finished run writes its curve to ``CURVE_FILE`` in its
folder, keyed by arm, seed and the hash of its resolved gin bindings (`run_signature`), and a
rerun reuses the runs whose key matches. A run has no checkpoints, so one killed midway (its
folder without a curve) or made with another config trains again from scratch in a fresh
folder. ``results.json`` is written after every complete seed, marked ``partial`` until the last.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.repro import stats
from jaxrl_llm.repro.specs import Prepared, PrepOptions, Repro

log = logging.getLogger(__name__)

VAL_KEY = "val/test_score"
TRAIN_KEY = "critic/score/mean"
METRICS = ("final", "mean", "gain")
CURVE_FILE = "curve.json"  # in a run's folder, written once the run finished


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
    (so they win), checked against every arm before anything trains; the preparation's RL
    runs take them too, under its own data and step bindings (`PrepOptions.gin_params`)."""
    if not seeds:
        raise ValueError(f"repro {repro.name} needs at least one seed, got none")
    check_gin_params(repro, gin_params)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    prepare = repro.prepare_fn()
    options = PrepOptions(out_dir, tuple(seeds), prep_steps, tuple(gin_params))
    prepared = prepare(options) if prepare else Prepared()
    prep_s = time.perf_counter() - t0
    curves: list[RunCurve] = []
    reused = 0
    result: dict[str, Any] = {}
    for i, seed in enumerate(seeds):  # seed-major: a partial run still holds complete pairs
        for arm in repro.arms:
            params = [
                *arm.gin_params,
                *prepared.params(arm.name, seed),
                *seed_params(seed, steps),
                *gin_params,
            ]
            run_dir = out_dir / "runs" / f"{arm.name}-seed{seed}"
            signature = run_signature(arm.gin_files, params, prep_steps)
            curve, was_reused = finished_or_trained(
                arm.name, seed, arm.gin_files, params, run_dir, signature
            )
            curves.append(curve)
            reused += was_reused
        result = summarise(repro, curves, prepared, steps=steps, gin_params=gin_params)
        if i + 1 < len(seeds):
            result["partial"] = {"seeds_planned": list(seeds)}
        result["timing"] = {
            "prepare_s": round(prep_s, 1),
            "total_s": round(time.perf_counter() - t0, 1),
            "reused_runs": reused,  # finished runs an earlier, interrupted call left
        }
        write_json(out_dir / "results.json", result)
    return result


def finished_or_trained(
    arm: str,
    seed: int,
    gin_files: Sequence[str],
    params: Sequence[str],
    run_dir: Path,
    signature: str,
) -> tuple[RunCurve, bool]:
    """The run's curve, and whether it was reused: from ``run_dir/CURVE_FILE`` when a run of
    the same arm, seed and `signature` finished there, else trained now in a fresh folder."""
    done = finished_curve(run_dir, arm, seed, signature)
    if done is not None:
        log.info("repro: reusing the finished run %s (same arm, seed and config)", run_dir)
        return done, True
    if run_dir.exists():  # killed midway (no curve), or made with another config
        log.warning("repro: %s holds no finished run of this config; training it anew", run_dir)
        shutil.rmtree(run_dir)
    log.info("repro: arm %s seed %d -> %s", arm, seed, run_dir)
    t = time.perf_counter()
    records = train_run(gin_files, params, run_dir)
    curve = curve_of(arm, seed, records, time.perf_counter() - t, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CURVE_FILE, {"signature": signature, **dataclasses.asdict(curve)})
    return curve, False


def run_signature(gin_files: Sequence[str], params: Sequence[str], prep_steps: int | None) -> str:
    """SHA-256 of the run's resolved gin bindings (every file, include and binding, the paths
    to the preparation's outputs among them) and of the preparation's step cap, which changes
    what those paths hold. What it cannot see: code changes, and the files the bindings name
    changing otherwise (a preparation retrained on another host)."""
    import gin

    from jaxrl_llm.config import parse_gin

    try:
        parse_gin(list(gin_files), list(params))
        text = f"{gin.config_str()}\n# prep_steps = {prep_steps}\n"
        return hashlib.sha256(text.encode()).hexdigest()
    finally:
        gin.clear_config()


def finished_curve(run_dir: Path, arm: str, seed: int, signature: str) -> RunCurve | None:
    """The curve a finished run of this arm, seed and config signature left in `run_dir`."""
    path = run_dir / CURVE_FILE
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    same_run = (record.get("arm"), record.get("seed")) == (arm, seed)
    if not same_run or record.pop("signature", None) != signature:
        return None
    return curve_from_dict(record)


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Replaces `path` whole: a crash while writing leaves the earlier file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


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


def read_results(path: Path) -> dict[str, Any]:
    """An earlier run's ``results.json`` (for ``--report-only``), checked to hold readable
    per-seed curves, or a ``ConfigError`` naming the file and what is wrong with it."""
    fix = "run the reproduction again without --report-only to write it"
    if not path.is_file():
        raise ConfigError(f"--report-only needs {path} from an earlier run; it is missing")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"--report-only: {path} is not JSON ({e}); {fix}") from None
    if not isinstance(result, dict) or not isinstance(result.get("arms"), dict):
        raise ConfigError(f"--report-only: {path} has no 'arms' (per-arm runs); {fix}")
    try:
        for arm in result["arms"].values():
            for run in arm["runs"]:
                curve_from_dict(run)
    except (KeyError, TypeError, ValueError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise ConfigError(
            f"--report-only: {path} has a run it cannot read ({what}); {fix}"
        ) from None
    return result


def resummarise(repro: Repro, result: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` summarised again from its per-seed curves (no training): for a
    report whose statistics changed after the runs, or a partial run's curves."""
    curves = [curve_from_dict(run) for arm in result["arms"].values() for run in arm["runs"]]
    prepared = Prepared(notes=result.get("prepared", {}))
    gin_params = result.get("gin_params", [])
    out = summarise(repro, curves, prepared, steps=result.get("steps"), gin_params=gin_params)
    partial = {"partial": result["partial"]} if "partial" in result else {}
    return {**out, **partial, "timing": result.get("timing", {})}


def curve_from_dict(run: dict[str, Any]) -> RunCurve:
    """A `RunCurve` from its JSON form (``results.json``'s runs, a run's ``CURVE_FILE``)."""
    return RunCurve(
        arm=str(run["arm"]),
        seed=int(run["seed"]),
        val_steps=tuple(int(s) for s in run["val_steps"]),
        val_scores=tuple(float(v) for v in run["val_scores"]),
        train_scores=tuple(float(v) for v in run["train_scores"]),
        wall_s=float(run["wall_s"]),
        run_dir=str(run["run_dir"]),
    )
