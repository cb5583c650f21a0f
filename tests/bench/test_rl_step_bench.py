"""`jaxrl-llm bench rl-step` prints one JSON object whose phases add up (not a speed test)."""

import itertools
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
    "RolloutConfig.steps_per_call = 4",
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
    assert bare["rollout_tail_s"] == pytest.approx(bare["prefill_insert_s"] + bare["decode_tail_s"])
    assert bare["decode_calls"] == math.ceil(shape["decode_steps_tail"] / 4)  # steps_per_call
    assert bare["total_s"] == pytest.approx(bare["rollout_s"] + bare["experience_s"]
                                            + bare["update_s"])  # fmt: skip
    for key, value in out["ratios"].items():
        assert math.isfinite(value) and value > 0, key
    assert out["ratios"]["overhead_ratio"] == pytest.approx(phases["total"] / bare["total_s"])
    assert out["outside_steps_s"] > 0
    assert out["host"]["cpu"] and out["host"]["cores"] >= 1 and "devices" in out["host"]
    assert out["host"]["compile_cache"] is False  # xla_compile_s are compiles, not loads


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


class FakeDecode:
    """A device whose decode call costs more the longer the rows are (as the paged engine's
    does: it reads only the pages a row holds), on a clock of whole ticks (exact sums).
    Calls queue on the device as JAX dispatches them; `wait` returns when one is done."""

    def __init__(self, prompt_len: int, steps_per_call: int):
        self.now = self.busy_until = 0.0
        self.P, self.spc = prompt_len, steps_per_call
        self.fills = 0

    def cost(self, length: int) -> float:
        return float(length)  # ticks: a call over rows of `length` tokens

    def fill(self) -> int:
        self.fills += 1
        self.now += 1000.0  # prefill and inserts: not decode time
        return self.P

    def call(self, length: int) -> tuple[int, float]:
        self.busy_until = max(self.now, self.busy_until) + self.cost(length)
        return length + self.spc, self.busy_until

    def wait(self, done: float) -> None:
        self.now = max(self.now, done)

    def clock(self) -> float:
        return self.now


def test_the_bare_decode_counts_each_call_at_its_own_row_length():
    """The running total after each call is the sum of every call's own cost, from the
    prompt on (rows grow by steps_per_call a call); rollout_s and rollout_tail_s read it at
    the calls their decode steps need, so a long tail costs what its long rows cost."""
    from jaxrl_llm.bench.rl_step_bare import rollout_seconds, running_decode_s

    P, spc = 10, 4
    dev = FakeDecode(P, spc)
    totals = running_decode_s(dev.fill, dev.call, dev.wait, 4, 100, clock=dev.clock)
    costs = [dev.cost(P + i * spc) for i in range(4)]  # 10, 14, 18, 22
    assert totals == list(itertools.accumulate(costs)) and dev.fills == 1
    shape = {"decode_steps": 5, "decode_steps_tail": 13}  # 2 and 4 calls of 4 steps
    out = rollout_seconds(0.5, totals, shape, spc)
    assert out["rollout_s"] == 0.5 + costs[0] + costs[1]
    assert out["rollout_tail_s"] == 0.5 + sum(costs)
    assert out["decode_calls"] == 4 and out["prefill_insert_s"] == 0.5
    # One call's cost times the calls, as an equal cost per call would say, is too little.
    assert out["rollout_tail_s"] - 0.5 > 4 * costs[0]


def test_the_bare_decode_fills_the_rows_again_when_their_cache_is_full():
    """More calls than a row's cache holds (samples > slots): the rows are filled again,
    untimed, and decode goes on from the prompt, as a slot takes its next sample."""
    from jaxrl_llm.bench.rl_step_bare import running_decode_s

    P, spc = 10, 4
    dev = FakeDecode(P, spc)
    totals = running_decode_s(dev.fill, dev.call, dev.wait, 5, 2, clock=dev.clock)
    costs = [dev.cost(P + (i % 2) * spc) for i in range(5)]  # 10, 14, 10, 14, 10
    assert totals == list(itertools.accumulate(costs)) and dev.fills == 3
