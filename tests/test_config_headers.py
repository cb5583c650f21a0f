"""Each shipped config's header gives commands that run as written: a `train`/`sft`/`rm`/`bench`
command sets every "SET_..." placeholder its files leave, and a `plan` command (it reads no
weights) exits 0, that is the planner says the setting fits."""

import argparse
import dataclasses
import shlex

import pytest

from jaxrl_llm.config import CONFIGS_DIR, parse_gin
from jaxrl_llm.learner import plan_cli
from jaxrl_llm.learner.reward_training import RMConfig
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.sft import SFTConfig

CONFIG_OF = {"train": RLConfig, "bench": RLConfig, "plan": RLConfig, "sft": SFTConfig,
             "rm": RMConfig}  # fmt: skip


def header_commands(text: str) -> list[list[str]]:
    """Commands in the leading comment block: a comment line that starts with `jaxrl-llm`,
    continued over lines that end in a backslash; each cut at its first word that is neither
    a subcommand nor an option (prose such as "(no flags: this file)")."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.removeprefix("#").strip())
    commands, current = [], None
    for line in lines:
        if current is None and not line.startswith("jaxrl-llm "):
            continue
        current = (current or "") + " " + line.removesuffix("\\")
        if not line.endswith("\\"):
            commands.append(_command_words(shlex.split(current)))
            current = None
    return commands


def _command_words(words: list[str]) -> list[str]:
    out = words[:2]  # jaxrl-llm COMMAND
    rest = iter(words[2:])
    for word in rest:
        if word.startswith("--"):
            out.append(word)
            if "=" not in word:
                value = next(rest, None)
                if value is None or value.startswith(("[", "(")):
                    break
                out.append(value)
        elif len(out) == 2 and word.replace("-", "").isalpha():
            out.append(word)  # bench rl-step
        else:
            break
    return out


def _gin_args(words: list[str]) -> tuple[list[str], list[str]]:
    files, params = [], []
    for i, word in enumerate(words):
        for flag, into in (("--gin_file", files), ("--gin_param", params)):
            if word.startswith(flag + "="):
                into.append(word.split("=", 1)[1])
            elif word == flag:
                into.append(words[i + 1])
    return files, params


def placeholders(cfg: object) -> list[str]:
    """Every "SET_..." string left in a config tree."""
    out = []
    for field in dataclasses.fields(cfg):  # pyright: ignore[reportArgumentType]
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value):
            out += placeholders(value)
        elif isinstance(value, str) and value.startswith("SET_"):
            out.append(f"{type(cfg).__name__}.{field.name} = {value!r}")
    return out


# Cases of 5 s or more in the fast tier (the tier's rule, docs/testing.md): measured 6.0 s
# (a `plan` of the 7B shape; AMD EPYC, 2026-12-06).
SLOW_CASES = {"limr_ppo_qwen2.5_math_7b-1"}
CASES = [
    pytest.param(path.name, words, id=case, marks=[pytest.mark.slow] if case in SLOW_CASES else [])
    for path in sorted(CONFIGS_DIR.glob("*.gin"))
    for i, words in enumerate(header_commands(path.read_text()))
    for case in [f"{path.stem}-{i}"]
]
assert {c.id for c in CASES} >= SLOW_CASES, "a slow case names no config header's command"


@pytest.mark.parametrize(("name", "words"), CASES)
def test_header_command_runs_as_written(name, words):
    files, params = _gin_args(words)
    parse_gin(files or [name], params)
    left = placeholders(CONFIG_OF[words[1]]())
    assert not left, f"{name}: `{shlex.join(words)}` leaves {left}"
    if words[1] == "plan":
        parser = argparse.ArgumentParser()
        plan_cli.add_arguments(parser)
        assert plan_cli.main(parser.parse_args(words[2:])) == 0, shlex.join(words)


def test_header_commands_are_found():
    """The parser above finds the commands it is meant to check."""
    text = "# jaxrl-llm train (no flags)\n# x\n# jaxrl-llm plan --gin_file=a.gin \\\n#  --devices 8"
    assert header_commands(text) == [
        ["jaxrl-llm", "train"],
        ["jaxrl-llm", "plan", "--gin_file=a.gin", "--devices", "8"],
    ]
    assert header_commands("# jaxrl-llm bench rl-step --gin_file b.gin [--gin_param X=1]") == [
        ["jaxrl-llm", "bench", "rl-step", "--gin_file", "b.gin"]
    ]
