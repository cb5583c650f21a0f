"""`jaxrl-llm generate` over the driver, the lazy package import, and `ParamsRef`."""

import subprocess
import sys

import numpy as np
import pytest

from jaxrl_llm import cli


def test_importing_rollout_does_not_import_jetstream():
    code = (
        "import sys, jaxrl_llm, jaxrl_llm.rollout; "
        "assert 'jetstream' not in sys.modules and 'tensorflow' not in sys.modules; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow  # 27 s in a loaded 2-worker run, AMD EPYC AVX2
def test_generate_command_prints_completions(capsys):
    argv = ["generate", "--prompt", "Hi", "--prompt", "2+2=", "--max-new-tokens", "5", "--n",
            "2", "--temperature", "0.8", "--top-k", "20", "--stop", "zz", "--chat",
            "--slots", "2"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("=== prompt:") == 4 and "[sample 1]" in out
    assert "2 prompts x 2" in out


def test_params_ref_is_read_at_every_call(tiny_engine):
    from flax import nnx

    from jaxrl_llm.models import init_model
    from jaxrl_llm.rollout import ParamsRef
    from tests.rollout.reference import TINY

    ref = ParamsRef(tiny_engine.load_params())
    first = tiny_engine.place_params(ref)
    ref.value = nnx.split(init_model(TINY, seed=3))[1]
    second = tiny_engine.place_params(ref)
    a, b = jax_leaves(first)[0], jax_leaves(second)[0]
    assert not np.array_equal(np.asarray(a), np.asarray(b))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.parametrize("prompts", [[""], ["Hi", ""]])
def test_empty_prompt_is_a_configuration_error_before_the_model_loads(prompts, monkeypatch, capsys):
    from jaxrl_llm.rollout import commands

    def load(args):
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(commands, "load_sampling_model", load)
    argv = ["generate"] + [a for p in prompts for a in ("--prompt", p)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("jaxrl-llm generate: configuration error: --prompt ''"), err
