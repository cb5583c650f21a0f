"""A scripted policy in a real RL run: `rollout.Engine` replaced by a `ScriptedEngine`, as
tests/learner/test_rl_loop.py's Search-R1 test does, for the tests whose feature needs the
policy to write something the tiny model never writes (a tool call)."""

from collections.abc import Sequence

from jaxrl_llm.testing import ScriptedEngine


def script_the_engine(monkeypatch, turns: Sequence[str | Sequence[str]]) -> None:
    """Every `rollout.Engine` built from here on is a `ScriptedEngine` of `turns` with the
    real engine's parameter shardings (what the weight sync targets)."""
    import jaxrl_llm.rollout as rollout_pkg

    real_engine = rollout_pkg.Engine

    def scripted_engine(policy, *, tokenizer, max_concurrent_decodes, max_cache_length, **kw):
        real = real_engine(policy, tokenizer=tokenizer, max_cache_length=max_cache_length,
                           max_concurrent_decodes=max_concurrent_decodes, **kw)  # fmt: skip
        engine = ScriptedEngine(tokenizer, turns, batch=max_concurrent_decodes,
                                cache_length=max_cache_length,
                                max_prefill_length=kw["max_prefill_length"])  # fmt: skip
        engine.param_shardings = real.param_shardings
        return engine

    monkeypatch.setattr(rollout_pkg, "Engine", scripted_engine)
