"""`jaxrl-llm` command line: parse, then call one function.

Each subcommand lives in the module that owns its work and exposes
`add_arguments(parser)` and `main(args) -> int | None`. Modules are imported only when
their command runs, so `jaxrl-llm --help` stays fast (no JAX, no TensorFlow).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import MutableMapping
from types import FrameType

from jaxrl_llm import cpu_devices, huge_pages
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.user_cache import user_cache_dir

# name -> (module, one-line help); the module's add_arguments/main, or the names given.
COMMANDS: dict[str, tuple[str, str] | tuple[str, str, str, str]] = {
    "train": (
        "jaxrl_llm.learner.commands",
        "RL training (GRPO/PPO); no flags: the built-in tiny GRPO run on CPU",
        "add_train_arguments",
        "train_main",
    ),
    "generate": ("jaxrl_llm.rollout.commands", "generate completions from a checkpoint"),
    "serve": ("jaxrl_llm.rollout.server", "serve a checkpoint over JetStream's gRPC API"),
    "bench": ("jaxrl_llm.bench.cli", "benchmarks (rollout, train, rl-step), JSON output"),
    "plan": ("jaxrl_llm.learner.plan_cli", "memory per device of a run: fits? what to change"),
    "eval": ("jaxrl_llm.rollout.evaluate", "pass@1, pass@k and maj@k of a checkpoint"),
    "plot": ("jaxrl_llm.metrics.plots", "dashboard PNGs of one or more runs' metrics"),
    "export": ("jaxrl_llm.learner.export", "write a run's policy checkpoint as HF safetensors"),
    "limr": ("jaxrl_llm.data.limr_cli", "LIMR: score a run's prompts, select a subset"),
    "repro": ("jaxrl_llm.repro.cli", "miniature paper reproductions over seeds, with intervals"),
    "samples": ("jaxrl_llm.metrics.generations", "print a run's logged generations (text)"),
    "rm": ("jaxrl_llm.learner.reward_training", "train a reward model from preference pairs"),
    "score": ("jaxrl_llm.rollout.score_cli", "score a file's responses with any reward (JSON)"),
    "sft": (
        "jaxrl_llm.learner.commands",
        "supervised fine-tuning (builds the tiny default)",
        "add_sft_arguments",
        "sft_main",
    ),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<10} {entry[1]}" for name, entry in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="jaxrl-llm",
        description="JAX-native RL post-training for LLMs.",
        usage="jaxrl-llm COMMAND [options]",
        epilog=f"commands:\n{lines}\n\nRun 'jaxrl-llm COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    entry = COMMANDS[name]
    cpu_devices.size_thread_pool()  # before JAX starts: simulated CPU devices cannot deadlock
    compile_cache()
    # gs:// paths through fsspec/gcsfs: etils' default with TensorFlow installed (jetstream
    # pulls it in) is TF's gfile, which would import TensorFlow into every cloud run.
    os.environ.setdefault("EPATH_USE_TF", "false")
    module = importlib.import_module(entry[0])
    add_fn, main_fn = entry[2:] if len(entry) == 4 else ("add_arguments", "main")
    parser = argparse.ArgumentParser(prog=f"jaxrl-llm {name}", description=entry[1])
    getattr(module, add_fn)(parser)
    args = parser.parse_args(rest)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("jax._src.xla_bridge", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    installed = _exit_cleanly_on_sigterm()
    try:
        code = getattr(module, main_fn)(args)
    except ConfigError as e:  # a wrong gin value, path or checkpoint: the message says which
        print(f"jaxrl-llm {name}: configuration error: {_without_gin_trace(e)}", file=sys.stderr)
        return 2
    finally:  # stopping by SIGTERM: `_still_stopping` stays for the exit's own cleanups
        if installed and signal.getsignal(signal.SIGTERM) is not _still_stopping:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return int(code or 0)


CACHE_MAX_BYTES = 4 << 30  # the compile cache's size limit; JAX evicts the least recently used


def compile_cache(env: MutableMapping[str, str] = os.environ) -> str | None:
    """A persistent XLA compilation cache shared by every command and run of this user, so a
    program compiled once (the update step, decode, the experience pass) loads from disk in
    the next run instead of compiling again: `$XDG_CACHE_HOME/jaxrl-llm/xla` (else
    `~/.cache/jaxrl-llm/xla`), at most `CACHE_MAX_BYTES`, programs of 1 s of compile or more
    (JAX's default). JAX's own settings win: `JAX_COMPILATION_CACHE_DIR` elsewhere (a bucket
    on a pod), `JAX_ENABLE_COMPILATION_CACHE=false` for none. Set before JAX is imported;
    returns the folder set, or None (left to JAX, or the folder cannot be made)."""
    if "JAX_COMPILATION_CACHE_DIR" in env:
        return None
    folder = user_cache_dir("xla", env)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:  # a read-only home: run without the cache
        return None
    env["JAX_COMPILATION_CACHE_DIR"] = folder
    env.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(CACHE_MAX_BYTES))
    return folder


def _without_gin_trace(error: ConfigError) -> str:
    """The error's message without the "In call to configurable 'X'" lines gin appends when
    a configurable's constructor raises: one line, as the message itself is."""
    lines = str(error).splitlines()
    return "\n".join(x for x in lines if not x.strip().startswith("In call to configurable"))


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    # Once: a second SIGTERM (a scheduler's repeat, an impatient `kill`) raising again would
    # cut short the cleanups this one starts (an overlapped run's producer closing, the run's
    # last checkpoint and metrics). SIGKILL still ends the process at once.
    signal.signal(signum, _still_stopping)
    _say(f"jaxrl-llm: {signal.Signals(signum).name}: stopping")
    raise SystemExit(128 + signum)


def _still_stopping(signum: int, _frame: FrameType | None) -> None:
    _say(f"jaxrl-llm: {signal.Signals(signum).name} again: still stopping (SIGKILL ends it now)")


def _say(line: str) -> None:
    """A signal handler's line on stderr: os.write, not print, since a handler that prints
    while the code it interrupted is printing raises ("reentrant call" on the buffered
    stream) in place of what it meant to do."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _exit_cleanly_on_sigterm() -> bool:
    """SIGTERM (`timeout`, `kill`, a scheduler) exits through Python, not around it.

    Python's default for SIGTERM ends the process at once: no `finally`, no `with` exit. A
    benchmark stopped that way left its 1.9 GB Qwen2.5-0.5B-shaped checkpoint in /tmp each
    time, and a disk filled by them failed the next install. Raising SystemExit instead runs
    every cleanup on the way out; the exit status stays 128 + 15, as a shell reports a
    signalled process. A handler someone else installed (a server's own) is left alone.
    Returns whether the handler was installed (and so is the caller's to remove).
    """
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, _raise_exit)
    except ValueError:  # not the main thread: signals are not ours to set
        return False
    return True


def entry() -> None:
    """The `jaxrl-llm` program (and `python -m jaxrl_llm.cli`): before a command runs, the
    process starts again with huge pages for XLA:CPU's buffers where that changes something
    (`huge_pages`); then `main`. Tests call `main` itself, which never restarts."""
    argv = sys.argv[1:]
    if argv and argv[0] in COMMANDS:
        huge_pages.reexec_with_huge_pages()
    sys.exit(main(argv))


if __name__ == "__main__":
    entry()
