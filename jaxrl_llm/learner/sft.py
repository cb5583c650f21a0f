"""Supervised fine-tuning on the built-in task (or any prompt/response jsonl).

The loss is the token-mean negative log-likelihood of the response tokens. Text that an
environment writes, not the model (a tool's "\\n{result}\\n```\\n" after the model's
"```output"), is masked out, exactly as RL will mask it: through the closing fence and its
line ending if there is one, so text that follows the fence on the same line is trained. The
model's own stop string "```output" is trained, so the policy learns to ask for the tool.
A `train_file` is read as jsonl by `data.sources.read_jsonl` (lines split on "\\n" only). A
row is a prompt/response pair (`prompt`: a string, or chat messages rendered as those
messages, by `data.examples.row_conversation` as `rm` and `score` read them; `response`: a
string; optionally `system`: a string replacing the prompt's system message) or an agent
episode (`messages`, `tools`: `agents.demonstrations.check_episode`). Each row is checked as
it is read: a broken one stops the run with its file, line and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.algorithms import token_logprobs
from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.config_checks import ConfigError, Ge, Interval, checked_fields, documented
from jaxrl_llm.config_record import write_resolved_config
from jaxrl_llm.data.examples import row_conversation
from jaxrl_llm.data.sources import SourceConfig, read_records, require_source
from jaxrl_llm.data.tasks import arithmetic
from jaxrl_llm.data.templates import chat_prompt
from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
from jaxrl_llm.learner.run import check_context
from jaxrl_llm.learner.state import TrainState, accumulate_gradients, apply_gradients
from jaxrl_llm.models import from_pretrained, load_tokenizer, save_pretrained
from jaxrl_llm.tools.python_tool import OUTPUT_START

_FENCE = "```"

log = logging.getLogger(__name__)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    n_train=Ge(1),
    n_val=Ge(0),
    tool_fraction=Interval(ge=0, le=1),
    steps=Ge(0),
    batch_size=Ge(1),
    micro_batches=Ge(1),
    seq_len=Ge(1),
    eval_every=Ge(0),
)
class SFTConfig:
    """Supervised fine-tuning settings (built-in arithmetic task unless `train_file`)."""

    checkpoint: str = documented(
        "builtin", "Model to fine-tune: a Hugging Face folder, or 'builtin' for the tiny model."
    )
    out_dir: str = documented(
        "runs/sft", "Output folder: sft_metrics.jsonl, and the trained model in HF form in hf/."
    )
    train_file: str | None = documented(
        None,
        "A jsonl of prompt / response pairs (`prompt` a string or chat messages, `response` "
        "a string, `system` optional), or of agent episodes ({messages, tools}: "
        "docs/agents.md), its first `n_val` rows validating; None: the "
        "built-in arithmetic task.",
    )
    n_train: int = documented(20000, "Training examples the built-in task generates.")
    n_val: int = documented(256, "Validation examples, whose loss is tracked; 0: none.")
    levels: tuple[int, ...] = documented(
        (1, 2, 3, 4), "Difficulty levels of the built-in task's problems."
    )
    tool_fraction: float = documented(
        0.5, "Fraction of built-in examples solved with the Python tool rather than in words."
    )
    # None leaves no cue, so the model learns to choose between reasoning and the tool by
    # itself (what RL then sharpens).
    tool_system_prompt: str | None = documented(
        None, "System message on the tool-style examples; None: none."
    )
    steps: int = documented(2000, "Optimizer steps.")
    batch_size: int = documented(32, "Sequences per optimizer step.")
    micro_batches: int = documented(
        1, "Gradient-accumulation chunks per step; must divide `batch_size`."
    )
    seq_len: int = documented(
        192, "Tokens per training row; longer examples are dropped (counted and logged)."
    )
    eval_every: int = documented(
        200, "Steps between validation losses (and at the last step); 0: the last step only."
    )
    seed: int = documented(0, "Seed of the built-in task, the batch order and the model state.")
    optim: OptimConfig = documented(
        doc="The optimizer; bind `OptimConfig.*` (configs/sft_tiny.gin does).", factory=OptimConfig
    )

    def __post_init__(self):
        if self.batch_size % self.micro_batches:
            raise ConfigError(
                f"SFTConfig.batch_size = {self.batch_size} is not divisible by "
                f"SFTConfig.micro_batches = {self.micro_batches}"
            )
        arithmetic.check_levels("SFTConfig.levels", self.levels)


def file_examples(cfg: SFTConfig) -> tuple[list[dict], list[dict]]:
    """(train, val): `train_file`'s rows after / before `n_val`.

    Read as jsonl whatever its suffix, by the data pipeline's reader (`sources.read_jsonl`),
    which splits on "\\n" only (a raw U+2028, U+2029 or U+0085 stays inside its JSON string);
    a broken row (bad JSON, or a row `encode_example` cannot encode: `check_row`) raises,
    naming its file and line.
    """
    assert cfg.train_file is not None
    rows = []
    for record in read_records(SourceConfig(cfg.train_file, format="jsonl")):
        where = f"SFTConfig.train_file: {record.source}: row {record.line}"
        if record.row is None:
            raise ConfigError(f"{where}: {record.error}; fix or remove that row")
        try:
            check_row(record.row)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}; fix or remove that row") from None
        rows.append(record.row)
    if len(rows) <= cfg.n_val:
        raise ConfigError(
            f"SFTConfig.train_file {cfg.train_file!r} has {len(rows)} rows; it needs more than "
            f"SFTConfig.n_val = {cfg.n_val} (the validation ones)"
        )
    return rows[cfg.n_val :], rows[: cfg.n_val]


def check_row(row: Mapping[str, Any]) -> None:
    """`ValueError` saying what is wrong unless `encode_example` can encode `row`: an agent
    episode (`messages`: `check_episode`) or a prompt/response pair (`pair_messages`)."""
    if "messages" in row:
        from jaxrl_llm.agents.demonstrations import check_episode

        check_episode(row["messages"], row.get("tools"))
    elif not {"prompt", "response"} <= row.keys():
        raise ValueError(
            f"expected 'prompt' and 'response' strings, or 'messages' (an agent episode); "
            f"it has {sorted(row)}"
        )
    else:
        pair_messages(row)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def pair_messages(example: Mapping[str, Any]) -> tuple[list[dict[str, str]], str]:
    """(The chat before the response, the response) of a prompt/response pair: `prompt` a
    string (one user message) or chat messages, as `data.examples.row_conversation` reads it;
    `system`, when given, replaces the prompt's system message ("": none, as
    `DataConfig.system_prompt`). `ValueError` saying what is
    wrong for any other row."""
    prompt, response, system = example["prompt"], example["response"], example.get("system")
    if not isinstance(prompt, str | list):
        raise ValueError(f"'prompt' must be a string or chat messages, got {_kind(prompt)}")
    messages = row_conversation({"prompt": prompt})
    if not isinstance(response, str):
        raise ValueError(f"'response' must be a string, got {_kind(response)}")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"'system' must be a string or null, got {_kind(system)}")
    if system is not None:  # as DataConfig.system_prompt: "" is no system turn
        messages = [m for m in messages if m["role"] != "system"]
        if system:
            messages.insert(0, {"role": "system", "content": system})
    return messages, response


def builtin_examples(cfg: SFTConfig) -> tuple[list[dict], list[dict]]:
    """(train, val) prompt/response pairs from the arithmetic task, tool and no-tool mixed.

    Both come from the task's train partition; `val` here only tracks the SFT loss.
    """
    # Only the train side of the task's fixed partition: RL validation never sees SFT data.
    problems = arithmetic.generate_problems(
        cfg.n_train + cfg.n_val, seed=cfg.seed, levels=cfg.levels, id_prefix="sft", split="train"
    )
    rng = np.random.default_rng(cfg.seed)
    out = []
    for p in problems:
        tool = rng.random() < cfg.tool_fraction
        out.append(
            {
                "system": cfg.tool_system_prompt if tool else None,
                "prompt": p["prompt"],
                "response": p["tool_solution"] if tool else p["solution"],
            }
        )
    return out[: cfg.n_train], out[cfg.n_train :]


def _environment_spans(response: str) -> list[tuple[int, int]]:
    """Character spans written by the tool: after each "```output" through its closing fence
    and that fence's line ending, if any ("\\n", or "\\r\\n" in CRLF text), as the RL tool
    writes "\\n{result}\\n```\\n" (`python_tool.format_observation`); an unclosed block runs
    to the end."""
    spans, i = [], 0
    while (j := response.find(OUTPUT_START, i)) >= 0:
        start = j + len(OUTPUT_START)
        close = response.find(_FENCE, start)
        if close < 0:
            end = len(response)
        else:
            end = close + len(_FENCE)
            end += next((len(nl) for nl in ("\n", "\r\n") if response.startswith(nl, end)), 0)
        spans.append((start, end))
        i = end
    return spans


def encode_example(example: dict, tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = train on it) for one prompt/response pair (`pair_messages`),
    or for one agent episode: a row with `messages` (and optionally `tools`, their JSON
    schemas), encoded as RL's episodes are (`agents.demonstrations.encode_episode`). A row
    neither can encode raises `ValueError` saying why (`check_row`)."""
    if "messages" in example:
        from jaxrl_llm.agents.demonstrations import encode_episode

        return encode_episode(example["messages"], example.get("tools"), tokenizer)
    messages, response = pair_messages(example)
    prompt = chat_prompt(tokenizer, messages)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    cursor = 0
    for start, end in [*_environment_spans(response), (len(response), len(response))]:
        model_part = tokenizer(response[cursor:start], add_special_tokens=False)["input_ids"]
        env_part = tokenizer(response[start:end], add_special_tokens=False)["input_ids"]
        ids += model_part + env_part
        mask += [1] * len(model_part) + [0] * len(env_part)
        cursor = end
    ids.append(tokenizer.eos_token_id)
    mask.append(1)
    return ids, mask


def pack(examples: list[dict], tokenizer: Any, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids and masks [N, seq_len]; longer examples are dropped and counted."""
    rows, masks, dropped = [], [], 0
    for ex in examples:
        ids, mask = encode_example(ex, tokenizer)
        if len(ids) > seq_len:
            dropped += 1
            continue
        pad = seq_len - len(ids)
        rows.append(ids + [tokenizer.pad_token_id or 0] * pad)
        masks.append(mask + [0] * pad)
    if dropped:
        log.warning(
            "dropped %d of %d examples longer than %d tokens", dropped, len(examples), seq_len
        )
    if not rows:
        raise ConfigError(f"no example fits in seq_len={seq_len}: raise SFTConfig.seq_len")
    return np.asarray(rows, np.int32), np.asarray(masks, np.float32)


def nll_loss(graphdef, params, batch, normalizer):
    """Token-sum NLL of masked targets divided by `normalizer` (global token count)."""
    ids, mask = batch["ids"], batch["mask"]
    model = nnx.merge(graphdef, params)
    logits = model(ids[:, :-1])
    logp = token_logprobs(logits, ids[:, 1:])
    target_mask = mask[:, 1:]
    loss = -jnp.sum(logp * target_mask) / normalizer
    return loss, {"tokens": jnp.sum(target_mask)}


def make_train_step(graphdef, tx):
    @jax.jit(donate_argnums=0)
    def train_step(state: TrainState, batch):
        normalizer = jnp.maximum(jnp.sum(batch["mask"][..., 1:]), 1.0)
        loss_fn = lambda p, mb: nll_loss(graphdef, p, mb, normalizer)
        loss, grads, metrics = accumulate_gradients(loss_fn, state.params, batch)
        metrics = jax.tree.map(lambda x: x.sum(0), metrics)  # per micro-batch -> total
        state, opt_metrics = apply_gradients(state, grads, tx)
        return state, {"loss": loss, **metrics, **opt_metrics}

    return train_step


def run_sft(cfg: SFTConfig | None = None) -> dict[str, float]:
    """Train, evaluate the validation NLL every `eval_every` steps, export HF to out_dir.

    The data and settings are checked (a bad row, an example set that fits no row, a
    `seq_len` past the model's `max_position_embeddings`) before anything is written to
    out_dir and before the model loads; then the resolved gin config
    goes to out_dir/config.gin."""
    cfg = cfg or SFTConfig()
    if cfg.train_file:
        require_source(cfg.train_file, "SFTConfig.train_file")
    src = resolve_checkpoint(cfg.checkpoint, "SFTConfig.checkpoint")
    check_context(cfg.seq_len, src, "SFTConfig.seq_len")  # rows of seq_len are allocated
    tokenizer = load_tokenizer(src)
    train, val = file_examples(cfg) if cfg.train_file else builtin_examples(cfg)
    train_ids, train_mask = pack(train, tokenizer, cfg.seq_len)
    val_batch, val_tokens = None, 0.0
    if val:
        val_ids, val_mask = pack(val, tokenizer, cfg.seq_len)
        val_batch = {"ids": jnp.asarray(val_ids), "mask": jnp.asarray(val_mask)}
        val_tokens = float(val_mask[:, 1:].sum())
    out = Path(cfg.out_dir)
    write_resolved_config(out)
    model = from_pretrained(src)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(cfg.optim, cfg.steps)
    state = TrainState.create(params, tx, jax.random.key(cfg.seed))
    step_fn = make_train_step(graphdef, tx)
    eval_fn = jax.jit(lambda p, b, n: nll_loss(graphdef, p, b, n)[0])
    rng = np.random.default_rng(cfg.seed)
    M = cfg.micro_batches  # divides batch_size (SFTConfig checks it)
    metrics_file = open(out / "sft_metrics.jsonl", "w")  # noqa: SIM115
    history: dict[str, float] = {}
    t0 = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        idx = rng.integers(0, len(train_ids), cfg.batch_size)
        batch = {
            "ids": jnp.asarray(train_ids[idx].reshape(M, -1, cfg.seq_len)),
            "mask": jnp.asarray(train_mask[idx].reshape(M, -1, cfg.seq_len)),
        }
        state, m = step_fn(state, batch)
        record = {"step": step, **{k: float(v) for k, v in m.items()}}
        due = step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0)
        if val_batch is not None and due:
            record["val/loss"] = float(eval_fn(state.params, val_batch, val_tokens))
            record["timing/elapsed_s"] = time.perf_counter() - t0
            log.info(
                "step %d loss %.4f val/loss %.4f (%.0fs)",
                step, record["loss"], record["val/loss"], record["timing/elapsed_s"],
            )  # fmt: skip
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
        history = record
    metrics_file.close()
    model = nnx.merge(graphdef, state.params)
    save_pretrained(model, out / "hf", tokenizer=tokenizer)
    if "val/loss" in history:
        log.info("saved %s (validation perplexity %.3f)", out / "hf", math.exp(history["val/loss"]))
    else:
        log.info("saved %s (no validation: SFTConfig.n_val = 0)", out / "hf")
    return history
