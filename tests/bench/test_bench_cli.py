"""`jaxrl-llm bench`'s shared flags and set-up: a flag out of range is one configuration-error
line before anything loads; every suite compiles with the persistent compile cache off."""

import pytest

from jaxrl_llm import cli


@pytest.mark.parametrize(
    ("suite", "flag", "value", "expected"),
    [
        ("rollout", "--repeats", "0", "an integer >= 1"),
        ("train", "--repeats", "0", "an integer >= 1"),
        ("rollout", "--batch", "0", "an integer >= 1"),
        ("rollout", "--steps-per-call", "0", "an integer >= 1"),
        ("rollout", "--new-tokens", "0", "an integer >= 1"),
        ("rollout", "--prompt-len", "0", "an integer >= 1"),
        ("train", "--seq-len", "1", "an integer >= 2"),
        ("rl-step", "--steps", "0", "an integer >= 1"),
    ],
)
def test_a_bench_flag_out_of_range_is_one_error_line(capsys, suite, flag, value, expected):
    argv = ["bench", suite, "--skip-hf", flag, value]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"jaxrl-llm bench: configuration error: {flag} = {value}: expected {expected}"


def test_max_response_below_min_response_is_refused(capsys):
    argv = ["bench", "train", "--packed", "--min-response", "8", "--max-response", "4"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--max-response = 4: expected an integer >= --min-response (8)")


def test_a_suite_compiles_without_the_persistent_compile_cache(tmp_path, monkeypatch):
    """`cli.compile_cache` turns the persistent cache on for every command; a warm one would
    report a compile of 0.7 s instead of 10 s. The bench runs its suite with the cache off
    (nothing read or written) and its JSON's `host` says so; the cache is on again after."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.compilation_cache import compilation_cache as cc

    from jaxrl_llm.bench import train
    from jaxrl_llm.bench.machine import host

    def cached_files() -> list[str]:
        return sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())

    def compile_new(c: float) -> None:  # a program no earlier call compiled
        jax.jit(lambda x: x * c + 0.25)(jnp.ones(3)).block_until_ready()

    seen = {}

    def suite_main(args) -> int:
        before = cached_files()
        compile_new(7.0)
        seen.update(written=cached_files() != before, host=host()["compile_cache"])
        return 0

    keys = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
            "jax_persistent_cache_min_compile_time_secs")  # fmt: skip
    saved = {k: getattr(jax.config, k) for k in keys}
    monkeypatch.setattr(train, "main", suite_main)
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        cc.reset_cache()
        compile_new(5.0)
        assert cached_files(), "the cache set up here writes nothing: the test would mean nothing"
        assert cli.main(["bench", "train"]) == 0
        assert seen == {"written": False, "host": False}
        assert host()["compile_cache"]  # on again once the suite is done
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        cc.reset_cache()
