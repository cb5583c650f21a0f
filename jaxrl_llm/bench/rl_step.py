"""`jaxrl-llm bench rl-step`: one GRPO step's time by phase, against its bare kernels.

What runs: `run_rl` for `--steps` steps of a gin config (default `configs/grpo_tiny.gin`,
then `--gin_param` overrides) in a temporary run dir, with no validation and no
checkpoints. Step 1 compiles and is dropped; `phases_s` holds, for each phase, the median
over the remaining steps of the loop's own timers (`per_step` keeps every step, step 1
included, so nothing is hidden):

    weight_sync  trainer params -> rollout params (`Rollout.sync_weights`: the re-layout
                 from the training to the sampling layout and the `rollout_dtype` cast, in
                 one jitted call; nothing when both layouts agree, as on one device;
                 multi-host, the gather of one copy per host)
    rollout      generation through the driver (host loop, stop strings, tool turns) and
                 reward scoring
    experience   packing, the experience pass (old and reference logprobs, skipped old ones
                 when exactly on-policy, advantages, batch metrics: one jitted program)
    update       ppo_epochs x mini_batches policy updates (mini-batches cut on the device)
    untimed      total - the four above (host work between the timers, the step's one
                 transfer of its metrics), per step
    total        the whole step (`timing/step`)

With `--gin_param RLConfig.max_staleness=K` (K >= 1: the next batches are sampled while
one trains, `learner/overlap.py`) the phases overlap: `rollout_wait` is the trainer's time
waiting for its batch (idle), `sampler_wait` the producer's wait for the weights its batch
needs (the sampler idle), `untimed` is total - (rollout_wait + experience + update),
`overlap` = (rollout + experience + update - total) / min(rollout, experience + update): 0
for phases in turn, 1 when the shorter side ran wholly beside the longer; `weight_sync`
then includes the producer's wait for the update that makes the weights it receives.

`fractions` are those medians over the median total. Each is a median on its own, so they
sum to exactly 1 only with one timed step; with several, to about 1.

Compilation is measured, not assumed: each step's `xla_compile_s` is the XLA compile time
JAX reported (`jax.monitoring`) between the previous step's end and its own (step 1's
includes the set-up; the persistent compile cache is off, `host.compile_cache`), and
`timed_steps_that_compiled` lists the timed steps with any. A later step may meet a new
prompt or tool-output width; so the default is 4 steps, and the median of steps 2-4 is, as
a rule, a step that compiled nothing.

Baseline (`bench/rl_step_bare.py`), measured in the same process right after the run, on
the same checkpoint, mesh, engine sizes, sampling settings and batch shapes: the jitted
kernels alone, with no host logic, no tools, no rewards ("bare"). Each is warmed up until a
call compiles nothing, then timed `--repeats` times; the median is used, as for the steps.

    bare rollout     an engine sized as the run's (`Rollout`'s slots, cache, prefill width;
                     EOS off so rows run their whole budget): prompts_per_step prefills at
                     the bucket of the steps' mean prompt length and prompts x n slot
                     inserts, then decode calls of steps_per_call steps from there, timed
                     as a running total after each call (a call costs more as the rows grow:
                     the paged cache reads the pages a row holds), up to the calls of
                     rollout_tail_s (if the rows reach the cache's end first, as with more
                     samples than slots, they are filled again, untimed, and the total goes
                     on). Each length below is prefill_insert_s + that total after the
                     ceil(steps / steps_per_call) calls its steps need (`decode_s`,
                     `decode_tail_s`; `decode_calls` the calls timed):
                       rollout_s       ceil(response tokens / slots) decode steps: the fewest
                                       that produce the step's tokens (a tokens-matched floor)
                       rollout_tail_s  at least the longest response's length: what this
                                       engine needs when every sample starts together
    bare experience  the run's jitted experience pass on [B, T] (rows of the mean prompt
                     and mean response lengths: logprobs are computed on response tokens)
    bare update      ppo_epochs x mini_batches calls of the real jitted policy step on one
                     [M, mb, T] mini-batch

Ratios (1.0 = the step phase costs what its kernels alone cost; lower is better):

    overhead_ratio        total / (bare rollout_s + experience_s + update_s): how far one RL
                          step is from its kernels alone. Everything the step does beyond
                          them is in it: weight sync, waiting for the longest sample, driver
                          host logic, tool calls, reward scoring, host transfers for metrics.
    rollout_vs_bare       rollout / bare rollout_s
    rollout_tail_vs_bare  bare rollout_tail_s / rollout_s: the part of rollout_vs_bare that
                          waiting for the longest sample explains; the rest is the driver's
                          host work, tools and rewards
    experience_vs_bare, update_vs_bare   phase / its bare kernels

Approximations, stated: all prompts are prefilled at one bucket width (the run mixes
buckets); tool outputs inserted into a response are counted as decoded tokens (the run
appends them in one call, so this is generous to the baseline); with DAPO dynamic sampling
a step may generate several times and the baseline counts once. Configs with a critic
(`RLConfig.uses_critic`: an estimator registered with needs_critic, e.g. 'gae') are refused:
the baseline has no critic forward or update.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import statistics
import tempfile
import time
from pathlib import Path

from jaxrl_llm.bench.clock import CompileClock

PHASES = ("weight_sync", "rollout", "experience", "update")
DEFAULT_GIN = "grpo_tiny.gin"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """rl-step's own flags (the bench parser holds the shared ones, `--repeats` included)."""
    from jaxrl_llm.config import add_gin_arguments

    add_gin_arguments(parser)
    parser.add_argument("--steps", type=int, default=4, help="rl-step: RL steps (first dropped)")


@contextlib.contextmanager
def step_end_times():
    """perf_counter when each RL step ends: `run_rl` logs its "step N: ..." line then."""
    times: list[float] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.INFO and record.getMessage().startswith("step "):
                times.append(time.perf_counter())

    logger = logging.getLogger("jaxrl_llm.learner.rl_loop")
    handler, level = Handler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield times
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def step_phases(record: dict) -> dict[str, float]:
    """One step record -> phase seconds, `untimed` (total - timed phases), total, tokens/s;
    overlapped (the record has `timing/rollout_wait`), also the waits and `overlap`, with
    `untimed` as the module docstring defines them."""
    out = {p: float(record[f"timing/{p}"]) for p in PHASES}
    out["total"] = float(record["timing/step"])
    out["tokens_per_s"] = float(record["perf/tokens_per_s"])
    if "timing/rollout_wait" not in record:
        out["untimed"] = out["total"] - sum(out[p] for p in PHASES)
        return out
    out["rollout_wait"] = float(record["timing/rollout_wait"])
    out["sampler_wait"] = float(record.get("timing/sampler_wait", 0.0))
    for lag in ("mean", "max"):  # policy versions the trained tokens lag (partial rollouts: less)
        out[f"staleness_{lag}"] = float(record[f"rollout/staleness/{lag}"])
    rollout, training = out["rollout"], out["experience"] + out["update"]
    out["untimed"] = out["total"] - out["rollout_wait"] - training
    out["overlap"] = (rollout + training - out["total"]) / min(rollout, training)
    return out


def summarize(records: list[dict], compile_s: list[float] | None = None) -> dict:
    """Medians over steps 2.. of the phase timings, fractions of the step, each step's raw.

    `compile_s`: XLA compile seconds per step record (None: not measured)."""
    steps = [r for r in records if "timing/step" in r]
    per_step = [{"step": int(r["step"]), **step_phases(r)} for r in steps]
    for s, c in zip(per_step, compile_s or ()):
        s["xla_compile_s"] = c
    timed = [s for s in per_step if s["step"] > 1] or per_step  # step 1 compiles
    keys = (*PHASES, "rollout_wait", "sampler_wait", "overlap", "untimed", "total")
    phases = {k: statistics.median(s[k] for s in timed) for k in keys if k in timed[0]}
    lags = {k: statistics.mean(s[k] for s in timed) for k in ("staleness_mean", "staleness_max")
            if k in timed[0]}  # fmt: skip
    return {
        "timed_steps": [s["step"] for s in timed],
        "timed_steps_that_compiled": [s["step"] for s in timed if s.get("xla_compile_s", 0) > 0],
        "phases_s": phases,
        "fractions": {
            k: phases[k] / phases["total"]
            for k in (*PHASES, "rollout_wait", "untimed")
            if k in phases
        },
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        **({"staleness": lags} if lags else {}),  # means over the timed steps
        "per_step": per_step,
    }


def step_shape(cfg, records: list[dict]) -> dict:
    """The steps' batch as the baseline reproduces it (medians over the timed steps)."""
    steps = [r for r in records if "timing/step" in r]
    timed = [r for r in steps if r["step"] > 1] or steps
    B, slots = cfg.data.prompts_per_step * cfg.rollout.n, cfg.rollout.max_slots
    med = lambda f: statistics.median(f(r) for r in timed)
    response_mean = med(lambda r: r["response_length/mean"])
    response_max = round(med(lambda r: r["response_length/max"]))
    tokens = med(lambda r: r["perf/tokens_per_s"] * r["timing/step"])  # prompts + responses
    fewest = math.ceil(B * response_mean / slots)  # all slots busy, no waiting
    return {
        "prompts": cfg.data.prompts_per_step,
        "samples": B,
        "slots": slots,
        "seq_len": cfg.seq_len,
        "prompt_len_mean": max(1, round(tokens / B - response_mean)),
        "response_len_mean": response_mean,
        "response_len_max": response_max,
        "decode_steps": max(1, fewest),
        "decode_steps_tail": max(1, fewest, response_max),
    }


def run_steps(cfg, clock: CompileClock) -> tuple[list[dict], list[float] | None, float]:
    """`run_rl(cfg)` -> (records, XLA compile seconds per step or None, wall seconds).

    A step's compile seconds are those that ended after the previous step's log line (the
    run's start for step 1, so step 1 also carries the set-up's compiles)."""
    from jaxrl_llm.learner.rl_loop import run_rl

    with step_end_times() as ends:
        t0 = time.perf_counter()
        records = run_rl(cfg)
        wall = time.perf_counter() - t0
    n = sum("timing/step" in r for r in records)
    if len(ends) != n:  # the loop's log lines changed: say nothing rather than guess
        return records, None, wall
    edges = [t0, *ends]
    return records, [clock.between(a, b) for a, b in itertools.pairwise(edges)], wall


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.bench.machine import host
    from jaxrl_llm.bench.rl_step_bare import bare_kernels
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig

    files = args.gin_file or [DEFAULT_GIN]
    with tempfile.TemporaryDirectory() as tmp, CompileClock() as clock:
        overrides = [
            f"RLConfig.steps = {args.steps}",
            "RLConfig.eval_every = 0",
            "RLConfig.save_every = 0",
            f"RLConfig.run_dir = '{Path(tmp) / 'run'}'",
        ]
        backend = [f"RolloutConfig.backend = '{args.backend}'"] if args.backend != "jax" else []
        parse_gin(files, [*args.gin_param, *backend, *overrides])
        cfg = RLConfig()
        if cfg.uses_critic:
            raise SystemExit(
                f"bench rl-step: estimator {cfg.algo.estimator!r} trains a critic, which the "
                "baseline lacks"
            )
        records, compile_s, wall = run_steps(cfg, clock)
        summary = summarize(records, compile_s)
        shape = step_shape(cfg, records)
        bare = bare_kernels(cfg, shape, args.repeats, clock)
    phases = summary["phases_s"]
    bare["total_s"] = bare["rollout_s"] + bare["experience_s"] + bare["update_s"]
    result = {
        "suite": "rl-step",
        "gin_files": files,
        "gin_params": list(args.gin_param),
        "steps": args.steps,
        **{k: v for k, v in summary.items() if k != "per_step"},
        "shape": shape,
        "bare": bare,
        "ratios": {
            "overhead_ratio": phases["total"] / bare["total_s"],
            "rollout_vs_bare": phases["rollout"] / bare["rollout_s"],
            "rollout_tail_vs_bare": bare["rollout_tail_s"] / bare["rollout_s"],
            "experience_vs_bare": phases["experience"] / bare["experience_s"],
            "update_vs_bare": phases["update"] / bare["update_s"],
        },
        "host": host(),
        "run_wall_s": wall,
        "outside_steps_s": wall - sum(s["total"] for s in summary["per_step"]),
        "per_step": summary["per_step"],
    }
    print(json.dumps(result, indent=1))
    return 0
