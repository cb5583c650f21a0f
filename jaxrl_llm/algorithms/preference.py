"""Reward-model losses on preference pairs: pure functions of the two score vectors.

Shapes: P pairs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


def bradley_terry_loss(
    chosen: Array, rejected: Array, normalizer: float | Array | None = None
) -> Array:
    """sum_p -log sigmoid(chosen_p - rejected_p) / normalizer (default P: the mean).

    The Bradley-Terry model of a preference (Bradley & Terry 1952) as reward models are
    trained (Ouyang et al. 2022, eq. 1; TRL's `RewardTrainer`, OpenRLHF's `PairWiseLoss`),
    without TRL's optional margin term. Computed as softplus(rejected - chosen), which is
    the same value without overflow for large margins. Gradient with respect to chosen_p:
    -sigmoid(rejected_p - chosen_p) / normalizer (the opposite for rejected_p).
    `normalizer`: the whole batch's pair count when the pairs come in micro-batches.
    Shapes: chosen, rejected [P] -> a float32 scalar.
    """
    chosen = chosen.astype(jnp.float32)
    rejected = rejected.astype(jnp.float32)
    n = chosen.shape[0] if normalizer is None else normalizer
    return jnp.sum(jax.nn.softplus(rejected - chosen)) / n


def pair_accuracy(chosen: Array, rejected: Array) -> Array:
    """Fraction of pairs with chosen_p > rejected_p strictly (a tie counts as wrong): [P] -> []."""
    return jnp.mean((chosen > rejected).astype(jnp.float32))


__all__ = ["bradley_terry_loss", "pair_accuracy"]
