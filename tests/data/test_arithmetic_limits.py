"""The arithmetic task's problem space is finite at the mental levels: asking for more
distinct problems than a level and split hold is a clean `ConfigError` naming how many there
are, not an endless loop. Each call runs under an alarm, so the test fails (not hangs) if the
generator loops."""

import contextlib
import signal

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.preferences import builtin_preferences
from jaxrl_llm.data.tasks import arithmetic

DEADLINE_S = 30  # seconds; the counted error takes well under 1 s, the old code never returned


@contextlib.contextmanager
def deadline(seconds: int):
    def expire(signum, frame):
        raise TimeoutError(f"no return within {seconds} s: the generator loops")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _level2_prompts() -> set[str]:
    """Every level-2 prompt, from the task's description (a times-table product a x b,
    a in 2..9, b in 2..12, or the exact division a b / a), written out independently."""
    out = set()
    for a in range(2, 10):
        for b in range(2, 13):
            for n in arithmetic.NAMES:
                for i in arithmetic.ITEMS:
                    out.add(f"{n} buys {a} boxes of {b} {i}s. How many {i}s is that?")
                    out.add(
                        f"{n} shares {a * b} {i}s equally among {a} friends. "
                        f"How many {i}s does each get?"
                    )
    return out


def _train_count() -> int:
    return sum(arithmetic.split_of(p) == "train" for p in _level2_prompts())


def test_more_preference_pairs_than_the_levels_hold_is_a_config_error():
    available = _train_count()
    with deadline(DEADLINE_S), pytest.raises(ConfigError) as err:
        builtin_preferences(available + 1, levels=(2,))
    message = str(err.value)
    assert f"{available} distinct" in message and "(2,)" in message and "'train'" in message


def test_every_problem_of_a_level_can_be_drawn():
    """Exactly as many as the level and split hold: all of them, and no more."""
    available = _train_count()
    with deadline(DEADLINE_S):
        problems = arithmetic.generate_problems(available, levels=(2,), split="train")
    prompts = {p["prompt"] for p in problems}
    assert len(prompts) == available
    assert prompts == {p for p in _level2_prompts() if arithmetic.split_of(p) == "train"}


def test_excluded_prompts_count_against_the_space():
    prompts = sorted(_level2_prompts())
    exclude = set(prompts[:100])
    left = len(prompts) - len(exclude)
    with deadline(DEADLINE_S), pytest.raises(ConfigError, match=f"{left} distinct"):
        arithmetic.generate_problems(left + 1, levels=(2,), exclude_prompts=exclude)
