"""`generate`, `eval` and `serve` refuse a flag out of range with one line naming it, exit status 2,
before any model loads (`--steps-per-call 0` decoded forever, `--slots 0` was a KeyError)."""

import pytest

from jaxrl_llm import cli


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every case here must be refused before one loads."""

    def refuse(args):
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr("jaxrl_llm.rollout.commands.load_sampling_model", refuse)
    monkeypatch.setattr("jaxrl_llm.rollout.evaluate.load_sampling_model", refuse)
    monkeypatch.setattr("jaxrl_llm.rollout.server.load_sampling_model", refuse)


GENERATE = [
    (["--steps-per-call", "0"], "--steps-per-call = 0: expected an integer >= 1"),
    (["--slots", "0"], "--slots = 0: expected an integer >= 1"),
    (["--slots", "-2"], "--slots = -2: expected an integer >= 1"),
    (["--n", "0"], "--n = 0: expected an integer >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens = 0: expected an integer >= 1"),
    (["--top-p", "0", "--temperature", "1"], "--top-p = 0.0: expected a value in (0, 1]"),
    (["--temperature", "-1"], "--temperature = -1.0: expected a finite value >= 0"),
    # NaN compares False with everything: a NaN temperature sampled token 0 with NaN logprobs.
    (["--temperature", "nan"], "--temperature = nan: expected a finite value >= 0"),
    (["--temperature", "inf"], "--temperature = inf: expected a finite value >= 0"),
    (["--temperature", "1e39"], "--temperature = 1e+39: expected a finite value >= 0"),
    (["--top-p", "nan", "--temperature", "1"], "--top-p = nan: expected a value in (0, 1]"),
    (["--top-k", "-1", "--temperature", "1"], "--top-k = -1: expected >= 0"),
    (["--stop", ""], "--stop '': a stop string must not be empty"),
    (["--prompts-file", "/nonexistent/prompts.txt"], "--prompts-file '/nonexistent/prompts.txt'"),
    (["--mesh", "abc"], "--mesh must be DATA,FSDP,TENSOR"),
    (["--mesh", "16,1,1"], "--mesh data=16, fsdp=1, tensor=1: the mesh needs 16 devices"),
    (["--mesh", "3,1,-1"], "8 devices cannot be split"),  # tests run on 8 simulated devices
    (["--mesh", "1,0,1"], "mesh sizes must be positive or -1"),
]

SERVE = [
    (["--slots", "0"], "--slots = 0: expected an integer >= 1"),
    (["--mesh", "16,1,1"], "--mesh data=16, fsdp=1, tensor=1: the mesh needs 16 devices"),
    (["--mesh", "1,0,1"], "mesh sizes must be positive or -1"),
    (["--port", "70000"], "--port = 70000: expected 0 (any free port) to 65535"),
    (["--max-prefill-length", "0"], "--max-prefill-length = 0, --max-cache-length = 512"),
    (["--max-prefill-length", "512"], "expected 1 <= prefill < cache length"),
]

EVAL = [
    (["--n", "2"], "--n > 1 needs --temperature > 0"),
    (["--k", "3"], "every --k must be in [1, --n=1]"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--reward", "nope"], "--reward: unknown reward 'nope'"),
    (["--mesh", "16,1,1"], "--mesh data=16, fsdp=1, tensor=1: the mesh needs 16 devices"),
    (["--mesh", "abc"], "--mesh must be DATA,FSDP,TENSOR"),
    (["--n", "0", "--temperature", "1"], "--n = 0: expected an integer >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens = 0: expected an integer >= 1"),
    (["--temperature", "-1"], "--temperature = -1.0: expected a finite value >= 0"),
    (["--temperature", "nan"], "--temperature = nan: expected a finite value >= 0"),
    (["--top-p", "0"], "--top-p = 0.0: expected a value in (0, 1]"),
    (["--top-p", "nan"], "--top-p = nan: expected a value in (0, 1]"),
    (["--max-prompt-length", "0"], "--max-prompt-length must be >= 1, got 0"),
    (["--preset", "math500"], "--preset math500 reads a file"),
]


def _refused(command: str, flags: list[str], message: str, capsys) -> None:
    assert cli.main([command, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-llm {command}: configuration error: "), err
    assert message in err and len(err.strip().splitlines()) == 1, err  # no traceback


@pytest.mark.parametrize("flags, message", GENERATE, ids=[" ".join(f) for f, _ in GENERATE])
def test_generate_refuses_a_flag_out_of_range_by_name(flags, message, no_model, capsys):
    _refused("generate", flags, message, capsys)


def test_generate_refuses_a_prompts_file_without_prompts(tmp_path, no_model, capsys):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    _refused("generate", ["--prompts-file", str(blank)], "holds no prompt", capsys)


@pytest.mark.parametrize("flags, message", EVAL, ids=[" ".join(f) for f, _ in EVAL])
def test_eval_refuses_a_flag_out_of_range_by_name(flags, message, no_model, capsys):
    _refused("eval", ["--limit", "2", *flags], message, capsys)


@pytest.mark.parametrize("flags, message", SERVE, ids=[" ".join(f) for f, _ in SERVE])
def test_serve_refuses_a_flag_out_of_range_by_name(flags, message, no_model, capsys):
    _refused("serve", flags, message, capsys)
