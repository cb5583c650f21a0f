"""`samples` and `plot` on a folder that is not a run, and `samples --limit` below zero:
one line naming what is wrong, exit status 2, nothing silently dropped."""

import pytest

from jaxrl_llm import cli
from jaxrl_llm.metrics.generations import GenerationLog
from tests.metrics.test_generations import rollout, tokenizer  # noqa: F401 (a fixture)


@pytest.mark.parametrize(
    "command, message",
    [
        ("samples", "no generations/step_N.jsonl under"),
        ("plot", "no metrics.jsonl in"),
    ],
)
def test_a_missing_run_directory_is_one_clean_error(command, message, tmp_path, capsys):
    assert cli.main([command, str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-llm {command}: configuration error: {message}"), err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("limit", ["-1", "-3", "two"])
def test_samples_refuses_a_limit_below_zero(limit, tmp_path, tokenizer, capsys):  # noqa: F811
    GenerationLog(tmp_path, 4, tokenizer, tensorboard=False).write(1, rollout(tokenizer))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["samples", str(tmp_path), "--limit", limit])
    assert exit_.value.code == 2
    assert "--limit: expected an integer >= 0" in capsys.readouterr().err
    assert cli.main(["samples", str(tmp_path), "--limit", "0"]) == 0
    assert "(0 samples of step 1" in capsys.readouterr().out
