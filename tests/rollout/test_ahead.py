"""The decode program compiled ahead (`rollout/ahead.py`): a rollout's first decode program
is traced on the decode-ahead thread while the prefill and insert compile, and never again
by its first call; the samples equal those of an engine that compiles it in that call."""

import threading

import numpy as np

from jaxrl_llm.models import init_model
from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams

from .conftest import TINY

PROMPTS = [[7, 8, 9], [10, 11, 12, 13, 14]]
SAMPLING = SamplingParams(temperature=0.7, max_new_tokens=9, n=2)


def _engine(monkeypatch, ahead: bool) -> tuple[Engine, list[tuple[str, str]]]:
    """A fresh engine (its programs not compiled yet) whose traces are logged with the
    thread that made them."""
    engine = Engine(init_model(TINY, seed=0), max_concurrent_decodes=4, max_cache_length=48,
                    max_prefill_length=16)  # fmt: skip
    traces: list[tuple[str, str]] = []
    count = engine.programs._count
    log = lambda name: (traces.append((name, threading.current_thread().name)), count(name))
    monkeypatch.setattr(engine.programs, "_count", log)
    if not ahead:
        monkeypatch.setattr(engine, "compile_steps_ahead", lambda params, num_steps: None)
    return engine, traces


def test_the_decode_program_compiles_ahead_and_samples_the_same(monkeypatch):
    runs = {}
    for ahead in (True, False):
        engine, traces = _engine(monkeypatch, ahead)
        driver = RolloutDriver(engine, steps_per_call=4)
        first = driver.generate(PROMPTS, SAMPLING)
        again = driver.generate(PROMPTS, SAMPLING)  # compiled: no thread, no trace
        decode = [t for name, t in traces if name.startswith("generate_steps")]
        assert len(decode) == 1 and (decode[0] == "decode-ahead") == ahead, traces
        runs[ahead] = first + again
    for a, b in zip(runs[True], runs[False], strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
