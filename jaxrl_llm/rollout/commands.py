"""`jaxrl-llm generate`: print completions of prompts from a checkpoint.

Runs the RL rollout driver (continuous batching over the JetStream-API engine), so what
this prints is what training samples.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from jaxrl_llm.config_checks import FLOAT32_MAX, ConfigError
from jaxrl_llm.rollout.loading import add_model_arguments, load_sampling_model, parse_mesh

# Flags that count something and need at least one (those a command has are checked).
_AT_LEAST_ONE = ("n", "max_new_tokens", "slots", "steps_per_call")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)  # --checkpoint, --mesh, --dtype
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts-file", type=Path, help="one prompt per line")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--n", type=int, default=1, help="samples per prompt")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    parser.add_argument("--slots", type=int, default=8, help="concurrent decode slots")
    parser.add_argument("--steps-per-call", type=int, default=8, help="decode steps per call")


def check_sampling_flags(args: argparse.Namespace) -> None:
    """The sampling and engine flags `args` has, each in its range, or a `ConfigError` naming
    the flag: checked before any model loads (`--steps-per-call 0` would decode forever)."""
    for name in _AT_LEAST_ONE:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"{_flag(name)} = {value}: expected an integer >= 1")
    temperature = getattr(args, "temperature", 0.0)
    # NaN fails every comparison; sampling holds float32, where 1e39 is already inf.
    if not 0 <= temperature <= FLOAT32_MAX:
        raise ConfigError(
            f"--temperature = {temperature}: expected a finite value >= 0 (0 = greedy)"
        )
    if getattr(args, "top_k", 0) < 0:
        raise ConfigError(f"--top-k = {args.top_k}: expected >= 0 (0 = off)")
    if not 0.0 < getattr(args, "top_p", 1.0) <= 1.0:
        raise ConfigError(f"--top-p = {args.top_p}: expected a value in (0, 1] (1 = off)")
    if any(not s for s in getattr(args, "stop", None) or []):
        raise ConfigError("--stop '': a stop string must not be empty")


def check_mesh_flag(text: str) -> tuple[int, int, int]:
    """`--mesh` parsed and checked against the local devices, as `load_sampling_model` uses
    them (a mesh without -1 takes the first DATA*FSDP*TENSOR devices), or a `ConfigError`."""
    import jax

    from jaxrl_llm.sharding.mesh import resolve_mesh_shape

    try:
        sizes = parse_mesh(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    available = jax.local_device_count()
    used = available if -1 in sizes else min(available, max(1, math.prod(sizes)))
    resolve_mesh_shape(*sizes, num_devices=used, source="--mesh")
    return sizes


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _read_prompts(args: argparse.Namespace) -> list[str]:
    """`--prompts-file`'s non-empty lines, else the `--prompt`s, else one example prompt;
    an empty `--prompt` is a `ConfigError` here, before the model loads (the sampler
    refuses an empty prompt only after)."""
    if not args.prompts_file:
        if any(p == "" for p in args.prompt or []):
            raise ConfigError("--prompt '': a prompt must not be empty")
        return args.prompt or ["What is 12 + 30?"]
    name = str(args.prompts_file)
    if args.prompts_file.is_dir():
        raise ConfigError(f"--prompts-file {name!r} is a folder; expected a text file")
    if not args.prompts_file.is_file():
        raise ConfigError(f"--prompts-file {name!r}: no such file")
    try:
        text = args.prompts_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"--prompts-file {name!r} is not UTF-8 text (byte {e.start}: {e.reason}); "
            "save it as UTF-8, one prompt per line"
        ) from None
    prompts = [ln for ln in text.splitlines() if ln.strip()]
    if not prompts:
        raise ConfigError(f"--prompts-file {str(args.prompts_file)!r} holds no prompt")
    return prompts


def _prepare_prompts(args: argparse.Namespace) -> tuple[list[str], int, Any]:
    """The prompts as the model will see them (through the chat template with `--chat`), the
    longest one's tokens and the tokenizer (the model's loading reuses it); refused in one
    line, with the tokenizer alone loaded, when the template is missing or broken or the
    longest prompt plus `--max-new-tokens` would run past the model's context
    (`learner.run.check_context`)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.data.templates import chat_prompt, check_chat_template
    from jaxrl_llm.learner.run import check_context
    from jaxrl_llm.models import load_tokenizer

    prompts = _read_prompts(args)
    path = resolve_checkpoint(args.checkpoint, "--checkpoint")
    tokenizer = load_tokenizer(path)
    if args.chat:
        check_chat_template(tokenizer, "--chat")
        prompts = [chat_prompt(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    what = f"the longest prompt ({longest} tokens) + --max-new-tokens ({args.max_new_tokens})"
    check_context(longest + args.max_new_tokens, path, what)
    return prompts, longest, tokenizer


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.rollout.driver import RolloutDriver
    from jaxrl_llm.rollout.engine import Engine
    from jaxrl_llm.rollout.sampling import SamplingParams

    check_sampling_flags(args)
    check_mesh_flag(args.mesh)
    prompts, longest, tokenizer = _prepare_prompts(args)
    loaded = load_sampling_model(args, tokenizer)
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        n=args.n,
        seed=args.seed,
    )
    prefill = 16
    while prefill < longest:
        prefill *= 2
    engine = Engine(
        loaded.model,
        max_concurrent_decodes=args.slots,
        max_cache_length=prefill + args.max_new_tokens + 1,
        max_prefill_length=prefill,
        mesh=loaded.mesh,
        tokenizer=tokenizer,
        checkpoint_path=str(loaded.path),
    )
    driver = RolloutDriver(engine, tokenizer, steps_per_call=args.steps_per_call)
    t0 = time.perf_counter()
    outs = driver.generate(prompts, sampling)
    dt = time.perf_counter() - t0
    for c in outs:
        tag = f" [sample {c.sample_index}]" if args.n > 1 else ""
        print(f"=== prompt: {prompts[c.prompt_index]!r}{tag} ({c.finish_reason})\n{c.text}\n")
    n_tokens = sum(len(c.token_ids) for c in outs)
    print(f"[{len(prompts)} prompts x {args.n}, {n_tokens} new tokens in {dt:.1f}s incl. compile]")
    return 0
