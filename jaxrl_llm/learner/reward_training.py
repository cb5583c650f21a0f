"""`jaxrl-llm rm`: train a reward model from preference pairs with the Bradley-Terry loss.

    jaxrl-llm rm --gin_file rm_tiny.gin
    jaxrl-llm rm --gin_param 'RMConfig.train_file = "pairs.jsonl"' \\
        --gin_param 'RMConfig.checkpoint = "/models/Qwen2.5-0.5B-Instruct"'

The model is a `ValueModel` initialised from a policy checkpoint (its score head zero). A
pair's two conversations are rendered and scored exactly as `rewards.model.RewardModel`
scores them (`conversation`, `conversation_tokens`, `score_index`: the RM's chat template,
the head's output at the last non-pad token), so what is trained is what `rm:<folder>`
reads. The loss is `algorithms.preference.bradley_terry_loss`, the mean over pairs of
-log sigmoid(r(chosen) - r(rejected)). Every `eval_every` steps the held-out pairs' accuracy
(the fraction with r(chosen) > r(rejected)) and loss are logged to rm_metrics.jsonl; at the
end the model is written to `out_dir`/hf as a Hugging Face `*ForSequenceClassification`
folder (one label, `score.weight`, the tokenizer and its chat template).

Rows: `data.preferences` (file format); without `train_file`, pairs from the built-in
arithmetic task. Shapes: P pairs, R = 2P rows (chosen then rejected), T tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.algorithms.preference import bradley_terry_loss, pair_accuracy
from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.config import add_gin_arguments, parse_gin, write_resolved_config
from jaxrl_llm.config_checks import ConfigError, Ge, checked_fields, documented
from jaxrl_llm.data.preferences import builtin_preferences, read_preferences
from jaxrl_llm.data.tasks.arithmetic import check_levels
from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
from jaxrl_llm.learner.run import check_context
from jaxrl_llm.learner.state import TrainState, accumulate_gradients, apply_gradients
from jaxrl_llm.models import ModelConfig, load_tokenizer, save_pretrained
from jaxrl_llm.models.hf_files import read_config
from jaxrl_llm.models.hf_io import from_pretrained
from jaxrl_llm.models.transformer import ValueModel
from jaxrl_llm.rewards.model import conversation, conversation_tokens, score_index

log = logging.getLogger(__name__)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    n_train=Ge(1),
    n_val=Ge(1),
    steps=Ge(0),
    batch_size=Ge(1),
    micro_batches=Ge(1),
    seq_len=Ge(2),
    eval_every=Ge(0),
)
class RMConfig:
    """Reward-model training on preference pairs (docs/rewards.md, "Training a reward model")."""

    checkpoint: str = documented(
        "builtin",
        "Policy to start from (its trunk; the score head starts at zero): a Hugging Face "
        "folder, or 'builtin' for the tiny model.",
    )
    out_dir: str = documented(
        "runs/rm", "Output folder: rm_metrics.jsonl, and the reward model (HF) in hf/."
    )
    train_file: str | None = documented(
        None,
        "Preference pairs ({prompt or messages, chosen, rejected}; jsonl, json, parquet or "
        "arrow), its first `n_val` rows held out; None: pairs from the built-in arithmetic "
        "task (`n_train` + `n_val` of them).",
    )
    n_train: int = documented(2000, "Training pairs the built-in task makes.")
    n_val: int = documented(128, "Held-out pairs whose accuracy and loss are logged.")
    levels: tuple[int, ...] = documented(
        (1, 2), "Difficulty levels of the built-in task's problems."
    )
    steps: int = documented(200, "Optimizer steps.")
    batch_size: int = documented(32, "Pairs per optimizer step (2x rows).")
    micro_batches: int = documented(
        1, "Gradient-accumulation chunks per step; must divide `batch_size`."
    )
    seq_len: int = documented(
        256, "Tokens per row; a pair with a longer side is dropped (counted and logged)."
    )
    eval_every: int = documented(50, "Steps between held-out evaluations (and at the last).")
    seed: int = documented(0, "Seed of the built-in pairs and of the batch order.")
    optim: OptimConfig = documented(
        doc="The optimizer; bind `OptimConfig.*` (configs/rm_tiny.gin does).", factory=OptimConfig
    )

    def validate(self) -> None:
        if self.batch_size % self.micro_batches:
            raise ConfigError(
                f"RMConfig.batch_size = {self.batch_size} is not divisible by "
                f"RMConfig.micro_batches = {self.micro_batches}"
            )
        check_levels("RMConfig.levels", self.levels)


@dataclasses.dataclass(frozen=True)
class PairRows:
    """Pairs as padded token rows: ids, mask [P, 2, T] (chosen, rejected), last [P, 2]."""

    ids: np.ndarray
    mask: np.ndarray
    last: np.ndarray

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"ids": self.ids[idx], "mask": self.mask[idx], "last": self.last[idx]}


def encode_pairs(
    pairs: list[dict[str, Any]], tokenizer, seq_len: int, pad_id: int | None, name: str = "pairs"
):
    """The pairs rendered as the RM scores them, right-padded to `seq_len`; pairs with a
    side longer than that are dropped and counted; none left is a `ConfigError` naming
    `RMConfig.seq_len`, the `name`d pairs ("training pairs") and the length they need."""
    chats = [conversation(p, p[side]) for p in pairs for side in ("chosen", "rejected")]
    rows = conversation_tokens(tokenizer, chats)
    lengths = [max(len(rows[2 * i]), len(rows[2 * i + 1])) for i in range(len(pairs))]
    keep = [i for i, n in enumerate(lengths) if n <= seq_len]
    if len(keep) < len(pairs):
        log.warning(
            "dropped %d of %d pairs longer than %d tokens", len(pairs) - len(keep), len(pairs),
            seq_len,
        )  # fmt: skip
    if not keep:
        raise ConfigError(
            f"none of the {len(pairs)} {name} fits in RMConfig.seq_len = {seq_len} tokens (the "
            f"shortest needs {min(lengths)}): raise RMConfig.seq_len to {min(lengths)} or more"
        )
    P = len(keep)
    ids = np.full((P, 2, seq_len), pad_id if pad_id is not None else 0, np.int32)
    mask = np.zeros((P, 2, seq_len), np.int32)
    last = np.zeros((P, 2), np.int32)
    for p, i in enumerate(keep):
        for s in range(2):
            row = rows[2 * i + s]
            ids[p, s, : len(row)] = row
            mask[p, s, : len(row)] = 1
            last[p, s] = score_index(row, pad_id)
    return PairRows(ids, mask, last)


def pair_scores(model: ValueModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(r(chosen), r(rejected)) [P] each: the head's output at each row's scored token."""
    P, _, T = batch["ids"].shape
    values = model(batch["ids"].reshape(2 * P, T), attention_mask=batch["mask"].reshape(2 * P, T))
    scores = jnp.take_along_axis(values, batch["last"].reshape(2 * P, 1), axis=1)
    scores = scores.reshape(P, 2)
    return scores[:, 0], scores[:, 1]


def pair_loss(graphdef, params, batch, normalizer):
    chosen, rejected = pair_scores(nnx.merge(graphdef, params), batch)
    loss = bradley_terry_loss(chosen, rejected, normalizer)
    return loss, {"correct": jnp.sum((chosen > rejected).astype(jnp.float32))}


def make_train_step(graphdef, tx, batch_size: int):
    """A jitted step over [M, P/M, ...] micro-batches: BT loss, accumulated gradients, AdamW."""

    @jax.jit(donate_argnums=0)
    def train_step(state: TrainState, batch):
        loss_fn = lambda p, mb: pair_loss(graphdef, p, mb, batch_size)
        loss, grads, aux = accumulate_gradients(loss_fn, state.params, batch)
        # The loss ignores a shared offset: the bias's exact gradient is 0 and its float32 one
        # rounding, which Adam would scale up to lr-sized steps. HF's RM head has no bias.
        grads["score_bias"] = jax.tree.map(jnp.zeros_like, grads["score_bias"])
        state, opt_metrics = apply_gradients(state, grads, tx, loss)
        return state, {"loss": loss, "accuracy": aux["correct"].sum() / batch_size, **opt_metrics}

    return train_step


def make_eval(graphdef):
    """Held-out (loss, accuracy) over `PairRows`, in chunks of one compiled size."""

    @jax.jit
    def scores(params, batch):
        return pair_scores(nnx.merge(graphdef, params), batch)

    def evaluate(params, rows: PairRows, chunk: int) -> dict[str, float]:
        P = len(rows.ids)
        chosen, rejected = [], []
        for start in range(0, P, chunk):
            idx = np.arange(start, start + chunk) % P  # the last chunk wraps: one shape
            c, r = scores(params, jax.tree.map(jnp.asarray, rows.take(idx)))
            n = min(chunk, P - start)
            chosen.append(np.asarray(c)[:n])
            rejected.append(np.asarray(r)[:n])
        c, r = jnp.asarray(np.concatenate(chosen)), jnp.asarray(np.concatenate(rejected))
        return {
            "val/loss": float(bradley_terry_loss(c, r)),
            "val/accuracy": float(pair_accuracy(c, r)),
            "val/margin": float(jnp.mean(c - r)),
        }

    return evaluate


def load_pairs(cfg: RMConfig) -> tuple[list[dict], list[dict]]:
    """(train, held-out) pairs: the file's rows after / before `n_val`, or built-in ones."""
    if cfg.train_file:
        rows = read_preferences(cfg.train_file)
        if len(rows) <= cfg.n_val:
            raise ConfigError(
                f"RMConfig.train_file {cfg.train_file!r} has {len(rows)} pairs; it needs more "
                f"than RMConfig.n_val = {cfg.n_val} (the held-out ones)"
            )
        return rows[cfg.n_val :], rows[: cfg.n_val]
    rows = builtin_preferences(cfg.n_train + cfg.n_val, seed=cfg.seed, levels=cfg.levels)
    return rows[: cfg.n_train], rows[cfg.n_train :]


def run_rm(cfg: RMConfig | None = None) -> dict[str, float]:
    """Train, evaluate held-out pairs every `eval_every` steps, export the RM to out_dir/hf."""
    cfg = cfg or RMConfig()
    cfg.validate()
    src = resolve_checkpoint(cfg.checkpoint, "RMConfig.checkpoint")
    check_context(cfg.seq_len, src, "RMConfig.seq_len")  # rows of seq_len are allocated
    train, val = load_pairs(cfg)  # a bad row fails before the model loads
    tokenizer = load_tokenizer(src)
    pad_id = ModelConfig.from_hf(read_config(src)).pad_token_id  # the model's, unloaded
    train_rows = encode_pairs(train, tokenizer, cfg.seq_len, pad_id, "training pairs")
    val_rows = encode_pairs(val, tokenizer, cfg.seq_len, pad_id, "held-out pairs")
    out = Path(cfg.out_dir)
    write_resolved_config(out)  # once the config and data are checked
    model = from_pretrained(src, cls=ValueModel)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(cfg.optim, cfg.steps)
    state = TrainState.create(params, tx, jax.random.key(cfg.seed))
    step_fn = make_train_step(graphdef, tx, cfg.batch_size)
    evaluate = make_eval(graphdef)
    rng = np.random.default_rng(cfg.seed)
    M = cfg.micro_batches
    history: dict[str, float] = {}
    t0 = time.perf_counter()
    with open(out / "rm_metrics.jsonl", "w") as metrics_file:
        for step in range(1, cfg.steps + 1):
            idx = rng.integers(0, len(train_rows.ids), cfg.batch_size)
            batch = {
                k: jnp.asarray(v.reshape(M, -1, *v.shape[1:]))
                for k, v in train_rows.take(idx).items()
            }
            state, m = step_fn(state, batch)
            record: dict[str, float] = {"step": step, **{k: float(v) for k, v in m.items()}}
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
                record.update(evaluate(state.params, val_rows, cfg.batch_size))
                record["timing/elapsed_s"] = time.perf_counter() - t0
                log.info(
                    "step %d loss %.4f val/loss %.4f val/accuracy %.3f (%.0fs)", step,
                    record["loss"], record["val/loss"], record["val/accuracy"],
                    record["timing/elapsed_s"],
                )  # fmt: skip
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            history = record
    model = nnx.merge(graphdef, state.params)
    save_pretrained(model, out / "hf", tokenizer=tokenizer, head="sequence")
    log.info("saved the reward model to %s (use it as rm:%s)", out / "hf", out / "hf")
    return history


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl_llm.learner.commands import add_overwrite_argument

    add_gin_arguments(parser)
    add_overwrite_argument(parser)


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.commands import refuse_finished_out_dir

    parse_gin(args.gin_file, args.gin_param)
    cfg = RMConfig()
    refuse_finished_out_dir(cfg.out_dir, "RMConfig.out_dir", overwrite=args.overwrite)
    print(json.dumps(run_rm(cfg)))  # writes out_dir/config.gin once its inputs are checked
    return 0


__all__ = [
    "PairRows",
    "RMConfig",
    "encode_pairs",
    "load_pairs",
    "make_eval",
    "make_train_step",
    "pair_scores",
    "run_rm",
]
