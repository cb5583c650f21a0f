"""Generations you can read: a run's sampled text per step, and `jaxrl-llm samples`.

Each RL step, `GenerationLog.write` records the first `limit` samples of the step's batch
(whole GRPO groups come first, so a group's samples can be compared) as
run_dir/generations/step_N.jsonl, one `Generation` per line: the prompt as the model saw it
(chat template included), the response (tool outputs included), its reward, the prompt's
ground truth, finish reason, tool calls and each tool output, and the response's turns
(model and tool runs, special tokens kept). `jaxrl-llm samples` prints a multi-turn
response turn by turn: an agent episode reads as the model wrote and saw it. The same text goes to
TensorBoard's Text tab (tag "generations") when tensorboardX is installed. A resumed run
rewrites the steps it repeats, and TensorBoard shows those steps' text from the resumed
run only. `samples/step_N.jsonl` (ids and rewards, for LIMR) is
separate (`metrics/samples.py`).

    jaxrl-llm samples RUN_DIR              # the latest step's generations
    jaxrl-llm samples RUN_DIR --step 3 --limit 2
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import re
from typing import Any

import jax
import numpy as np
from etils import epath

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.metrics.tensorboard import summary_writer
from jaxrl_llm.types import Rollout

log = logging.getLogger(__name__)
FOLDER = "generations"
Run = tuple[str, str]  # ("model" | "tool", decoded text)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sample as text: a line of generations/step_N.jsonl."""

    step: int
    prompt_id: str
    sample: int  # index within its prompt's group
    prompt: str
    response: str
    reward: float
    answer: Any
    finish_reason: str
    tool_calls: int
    tool_outputs: list[str]  # each tool observation inserted into the response, in order
    # The response as its runs, ("model" | "tool", text with special tokens): an episode's
    # turns as the model wrote and saw them (end-of-turn and role tokens included).
    turns: list[Run] = dataclasses.field(default_factory=list)


def generations_of(rollout: Rollout, tokenizer: Any, step: int, limit: int) -> list[Generation]:
    """The first `limit` samples of `rollout` as text."""
    out = []
    G = rollout.group_size
    for b, c in enumerate(rollout.completions[:limit]):
        turns = _turns(c.token_ids, c.response_mask, tokenizer)  # decoded once for both
        out.append(
            Generation(
                step=step,
                prompt_id=str(rollout.prompt_ids[b // G]),
                sample=b % G,
                prompt=tokenizer.decode(np.asarray(c.prompt_ids).tolist()),
                response=c.text,
                reward=float(rollout.scores[b]),
                answer=rollout.answers[b],
                finish_reason=c.finish_reason,
                tool_calls=int(c.tool_calls),
                tool_outputs=[text for role, text in turns if role == "tool"],
                turns=turns,
            )
        )
    return out


def _turns(token_ids: np.ndarray, response_mask: np.ndarray, tokenizer: Any) -> list[Run]:
    """The response's runs of model (mask 1) and tool (mask 0) tokens, decoded in order."""
    ids, mask = np.asarray(token_ids), np.asarray(response_mask)
    cuts = [0, *(np.flatnonzero(np.diff(mask) != 0) + 1).tolist(), len(ids)]
    return [
        ("model" if mask[s] else "tool", tokenizer.decode(ids[s:e].tolist()))
        for s, e in itertools.pairwise(cuts)
        if e > s
    ]


class GenerationLog:
    """Writes `limit` samples per step (process 0 only; `limit` 0 writes nothing)."""

    def __init__(self, run_dir: str | os.PathLike, limit: int, tokenizer: Any, *, tensorboard=True):
        if limit < 0:
            raise ValueError(f"RLConfig.log_generations = {limit!r}: expected an int >= 0")
        self.dir = epath.Path(run_dir) / FOLDER
        self.limit, self.tokenizer = limit, tokenizer
        self.active = limit > 0 and jax.process_index() == 0
        self._run_dir, self._tensorboard = run_dir, self.active and tensorboard
        self._tb = None

    def write(self, step: int, rollout: Rollout) -> list[Generation]:
        if not self.active:
            return []
        records = generations_of(rollout, self.tokenizer, step, self.limit)
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(dataclasses.asdict(g), default=str) + "\n" for g in records)
        path = self.dir / f"step_{step}.jsonl"
        if "://" in os.fspath(path):  # an object appears whole when written: no rename
            path.write_text(lines, encoding="utf-8")
        else:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(lines, encoding="utf-8")
            tmp.replace(path)  # a reader never sees half a step
        if self._tensorboard and self._tb is None:
            # Opened at the first step written, not with the log: a resumed run rewrites
            # from here, so TensorBoard drops this step and later from earlier files
            # (unless the metrics writer, open already, did: `tensorboard.summary_writer`).
            self._tb = summary_writer(
                self._run_dir, purge_step=step, filename_suffix=".generations"
            )
            self._tensorboard = self._tb is not None
        if self._tb is not None:
            self._tb.add_text("generations", markdown(records), step)
            self._tb.flush()
        return records

    def close(self) -> None:
        self._tensorboard = False
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def header(g: Generation | dict[str, Any]) -> str:
    g = g if isinstance(g, dict) else dataclasses.asdict(g)
    calls = f" · {g['tool_calls']} tool call{'s' * (g['tool_calls'] != 1)}"
    return (
        f"step {g['step']} · prompt {g['prompt_id']} · sample {g['sample']} · "
        f"reward {g['reward']:.4g} · {g['finish_reason']}{calls * bool(g['tool_calls'])} · "
        f"answer {g['answer']!r}"
    )


def markdown(records: list[Generation]) -> str:
    """TensorBoard text: each sample's header, then prompt and response as indented code
    blocks (safe for responses that contain ``` fences themselves)."""
    indent = lambda text: "\n".join("    " + line for line in text.splitlines() or [""])
    parts = [
        f"**{header(g)}**\n\nprompt:\n\n{indent(g.prompt)}\n\nresponse:\n\n{indent(g.response)}"
        for g in records
    ]
    return "\n\n---\n\n".join(parts)


def logged_steps(run_dir: str | os.PathLike) -> list[int]:
    names = [p.name for p in (epath.Path(run_dir) / FOLDER).glob("step_*.jsonl")]
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"step_(\d+)\.jsonl", n)))


class NoGenerationsError(ConfigError, FileNotFoundError):
    """A run directory (or a step of it) has no logged generations."""


def read_generations(run_dir: str | os.PathLike, step: int | None = None) -> tuple[int, list[dict]]:
    """(step, records) of a run's generations at `step` (None: the latest logged)."""
    steps = logged_steps(run_dir)
    if not steps:
        raise NoGenerationsError(
            f"no {FOLDER}/step_N.jsonl under {run_dir}: not a run directory, or the run "
            "logged none (RLConfig.log_generations = 0)"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise NoGenerationsError(f"no generations for step {step} in {run_dir}; logged: {steps}")
    text = (epath.Path(run_dir) / FOLDER / f"step_{step}.jsonl").read_text(encoding="utf-8")
    return step, [json.loads(line) for line in text.splitlines() if line.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=epath.Path, help="a training run's directory")
    parser.add_argument("--step", type=int, default=None, help="which step (default: latest)")
    parser.add_argument("--limit", type=_count, default=None, help="print at most this many (>= 0)")
    parser.add_argument("--json", action="store_true", help="print the raw jsonl records")


def _count(text: str) -> int:
    """An integer >= 0, for argparse (which names the flag when this raises)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _print_response(g: dict[str, Any]) -> None:
    """The response whole, then each tool output; a multi-turn one (records that hold its
    `turns`) turn by turn instead, as the model wrote and saw it."""
    turns = g.get("turns") or []
    if len(turns) < 2:
        print(f"--- response\n{g['response']}")
        for i, output in enumerate(g["tool_outputs"], 1):
            print(f"--- tool output {i}\n{output}")
        return
    print("--- response, turn by turn (special tokens kept; tool turns are masked from the loss)")
    model = 0
    for role, text in turns:
        model += role == "model"
        print(f"--- model turn {model}" if role == "model" else "--- tool (masked)")
        print(text)


def main(args: argparse.Namespace) -> int:
    """`jaxrl-llm samples RUN [--step N]`: print a step's logged generations."""
    step, records = read_generations(args.run_dir, args.step)
    records = records[: args.limit] if args.limit is not None else records
    for g in records:
        if args.json:
            print(json.dumps(g))
            continue
        print(f"=== {header(g)}")
        print(f"--- prompt\n{g['prompt']}")
        _print_response(g)
        print()
    if not args.json:
        steps = logged_steps(args.run_dir)
        print(f"({len(records)} samples of step {step}; steps logged: {steps})")
    return 0
