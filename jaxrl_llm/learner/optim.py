"""Optimiser: optax AdamW with warmup and decay, global-norm clipping.

The gradient norm is reported before clipping (what verl logs as `actor/grad_norm`).
"""

from __future__ import annotations

import dataclasses

import gin
import optax

from jaxrl_llm.config_checks import Ge, Gt, Interval, checked_fields, documented


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    lr=Gt(0),
    warmup_steps=Ge(0),
    decay=("constant", "cosine", "linear"),
    min_lr_ratio=Interval(ge=0, le=1),
    weight_decay=Ge(0),
    b1=Interval(ge=0, lt=1),
    b2=Interval(ge=0, lt=1),
    eps=Gt(0),
    max_grad_norm=Ge(0),
)
class OptimConfig:
    """AdamW hyperparameters: linear warmup, then a constant, cosine or linear decay."""

    lr: float = documented(1e-6, "Peak learning rate, reached at the end of warmup.")
    warmup_steps: int = documented(0, "Optimizer steps of linear warmup from 0 to `lr`.")
    decay: str = documented(
        "constant", "How the learning rate falls after warmup, down to `lr * min_lr_ratio`."
    )
    min_lr_ratio: float = documented(
        0.0, "Final learning rate as a fraction of `lr` (cosine and linear decay only)."
    )
    weight_decay: float = documented(0.01, "AdamW's decoupled weight decay.")
    b1: float = documented(0.9, "Adam's decay rate of the first moment (gradient mean).")
    b2: float = documented(0.999, "Adam's decay rate of the second moment (squared gradient).")
    eps: float = documented(1e-8, "Adam's epsilon, added to the second moment's square root.")
    max_grad_norm: float = documented(
        1.0,
        "Clip gradients to this global norm (the norm is logged before clipping); 0: no clipping.",
    )


def learning_rate_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to lr over `warmup_steps`, then the chosen decay to the end."""
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.decay == "cosine":
        after = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.min_lr_ratio)
    elif cfg.decay == "linear":
        after = optax.linear_schedule(cfg.lr, end, decay_steps)
    else:
        after = optax.constant_schedule(cfg.lr)
    if cfg.warmup_steps <= 0:
        return after
    warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    chain = []
    if cfg.max_grad_norm and cfg.max_grad_norm > 0:
        chain.append(optax.clip_by_global_norm(cfg.max_grad_norm))
    chain.append(
        optax.adamw(
            learning_rate_schedule(cfg, total_steps),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
    )
    return optax.chain(*chain)
