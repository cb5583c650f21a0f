"""`jaxrl-llm bench rl-step` prints one JSON object whose phases add up (not a speed test)."""

import json
import math

import pytest

from jaxrl_llm import cli
from jaxrl_llm.bench.machine import host
from jaxrl_llm.bench.rl_step import PHASES, step_phases, summarize

# Two steps: step 1 compiles and is dropped, so step 2 is the one timed step (the least that
# exercises the median and the baseline). Tiny batch and budget, no tool, one reward worker.
TINY = [
    "DataConfig.prompts_per_step = 2",
    "DataConfig.builtin_train_size = 16",
    "DataConfig.val_size = 4",
    "RolloutConfig.n = 2",
    "RolloutConfig.max_new_tokens = 16",
    "RolloutConfig.max_slots = 4",
    "RolloutConfig.tool = 'none'",
    "AlgoConfig.mini_batches = 1",
    "AlgoConfig.micro_batch_size = 4",
    "RewardConfig.workers = 1",
]


@pytest.mark.slow  # two RL steps and their baselines: about 1.5 minutes on 2 cores
def test_bench_rl_step_json(capsys):
    argv = ["bench", "rl-step", "--steps", "2", "--repeats", "1"]
    argv += [arg for p in TINY for arg in ("--gin_param", p)]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["suite"] == "rl-step" and out["timed_steps"] == [2]
    assert [s["step"] for s in out["per_step"]] == [1, 2]
    # Compilation is attributed per step, and step 1 (first trace of everything) has some.
    assert out["per_step"][0]["xla_compile_s"] > 0
    assert set(out["timed_steps_that_compiled"]) <= set(out["timed_steps"])
    phases = out["phases_s"]
    for key in (*PHASES, "total"):
        assert math.isfinite(phases[key]) and phases[key] >= 0, key
    for key in ("rollout", "experience", "update", "total"):
        assert phases[key] > 0, key
    # The untimed gap is what the timers miss: phases plus gap are the step; the gap is small.
    timed = sum(phases[k] for k in PHASES)
    assert phases["untimed"] == pytest.approx(phases["total"] - timed, abs=1e-9)
    assert 0 <= phases["untimed"] < 0.5 * phases["total"]
    # One timed step: its fractions are exact and sum to 1.
    assert sum(out["fractions"].values()) == pytest.approx(1.0, abs=1e-9)
    assert out["tokens_per_s"] > 0
    shape = out["shape"]
    assert shape["samples"] == 4 and shape["slots"] == 4 and shape["seq_len"] == 128 + 16
    assert 1 <= shape["decode_steps"] <= shape["decode_steps_tail"] <= 16
    bare = out["bare"]
    for key in ("rollout_s", "rollout_tail_s", "experience_s", "update_s", "total_s"):
        assert math.isfinite(bare[key]) and bare[key] > 0, key
    assert bare["rollout_tail_s"] >= bare["rollout_s"]
    assert bare["total_s"] == pytest.approx(bare["rollout_s"] + bare["experience_s"]
                                            + bare["update_s"])  # fmt: skip
    for key, value in out["ratios"].items():
        assert math.isfinite(value) and value > 0, key
    assert out["ratios"]["overhead_ratio"] == pytest.approx(phases["total"] / bare["total_s"])
    assert out["outside_steps_s"] > 0
    assert out["host"]["cpu"] and out["host"]["cores"] >= 1 and "devices" in out["host"]


def test_summarize_drops_the_compile_step_and_takes_medians():
    def rec(step, scale):
        r = {f"timing/{p}": scale * (i + 1) for i, p in enumerate(PHASES)}
        return {"step": step, **r, "timing/step": scale * 11, "perf/tokens_per_s": 100 / scale}

    s = summarize([rec(1, 100.0), rec(2, 1.0), rec(3, 3.0), rec(4, 2.0)], [9.0, 0.5, 0, 0])
    assert s["timed_steps"] == [2, 3, 4] and s["timed_steps_that_compiled"] == [2]
    # Median step 2.0: phases 2, 4, 6, 8 of 22, untimed 22 - 20 = 2.
    assert s["phases_s"]["total"] == 22.0 and s["phases_s"]["untimed"] == pytest.approx(2.0)
    assert s["fractions"]["update"] == pytest.approx(8 / 22)
    assert s["tokens_per_s"] == pytest.approx(50.0)
    assert len(s["per_step"]) == 4


def test_an_overlapped_step_reports_its_wait_and_overlap():
    """`max_staleness >= 1`: the step is wait + experience + update; overlap 1 when the
    rollout ran wholly beside training, 0 when the trainer waited for all of it."""
    base = {"timing/weight_sync": 0.5, "timing/experience": 1.0, "timing/update": 3.0,
            "perf/tokens_per_s": 10.0, "rollout/staleness/mean": 0.25,
            "rollout/staleness/max": 1.0}  # fmt: skip
    beside = step_phases({**base, "timing/rollout": 2.0, "timing/rollout_wait": 0.0,
                          "timing/step": 4.25})  # fmt: skip
    assert beside["overlap"] == pytest.approx(1.0 - 0.25 / 2.0)
    assert beside["untimed"] == pytest.approx(0.25)
    in_turn = step_phases({**base, "timing/rollout": 2.0, "timing/rollout_wait": 2.0,
                           "timing/step": 6.0})  # fmt: skip
    assert in_turn["overlap"] == pytest.approx(0.0) and in_turn["untimed"] == pytest.approx(0)
    s = summarize([{"step": i, **base, "timing/rollout": 2.0, "timing/rollout_wait": 0.0,
                    "timing/step": 4.0} for i in (1, 2)])  # fmt: skip
    assert s["phases_s"]["overlap"] == 1.0 and s["fractions"]["rollout_wait"] == 0.0
    assert s["staleness"] == {"staleness_mean": 0.25, "staleness_max": 1.0}


def test_host_names_the_cpu_and_its_isa_extensions():
    cpuinfo = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
               "flags\t\t: fpu sse2 avx avx2 fma bmi2\n")  # fmt: skip
    h = host(cpuinfo)
    assert h["cpu"] == "AMD EPYC 7B13" and h["isa"] == ["avx", "avx2", "fma"]
    arm = host("Features\t: fp asimd sve\n")
    assert arm["isa"] == ["asimd", "sve"]
    assert host()["jax"]  # this machine's, whatever it is
