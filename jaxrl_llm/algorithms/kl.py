"""Per-token KL estimators between the policy and a reference, and the adaptive KL coefficient.

Shape legend: B batch, T response tokens. All estimators map ``logprobs[B, T]`` and
``ref_logprobs[B, T]`` (log-probabilities of the sampled tokens) to a per-token penalty
``[B, T]``; aggregate it with :func:`jaxrl_llm.algorithms.aggregate_loss` for a KL loss, or
subtract it from the token rewards (:func:`jaxrl_llm.algorithms.kl_shaped_rewards`).

Source: J. Schulman, "Approximating KL divergence" (2020, http://joschu.net/blog/kl-approx.html);
semantics and names of verl ``core_algos.kl_penalty``. With ``log r = ref - logp`` and samples
from the policy: k1 = ``-log r`` (unbiased, high variance, can be negative), k2 = ``(log r)^2 / 2``
(biased, low variance), k3 = ``r - 1 - log r`` (unbiased, non-negative, low variance).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from jaxrl_llm.algorithms.masked import compute_dtype
from jaxrl_llm.algorithms.registry import available, lookup, register

K3_LOG_RATIO_CLAMP = 20.0  # verl: clamp(ref - logp, -20, 20) before exp
K3_VALUE_CLAMP = 10.0  # verl: clamp(k3, -10, 10)


def _diff(logprobs: Array, ref_logprobs: Array) -> Array:
    dtype = compute_dtype(logprobs, ref_logprobs)
    return logprobs.astype(dtype) - ref_logprobs.astype(dtype)


@register("kl", "k1", "kl")
def kl_k1(logprobs: Array, ref_logprobs: Array) -> Array:
    """k1: ``logp - ref``."""
    return _diff(logprobs, ref_logprobs)


@register("kl", "abs")
def kl_abs(logprobs: Array, ref_logprobs: Array) -> Array:
    """abs: ``|logp - ref|``."""
    return jnp.abs(_diff(logprobs, ref_logprobs))


@register("kl", "k2", "mse")
def kl_k2(logprobs: Array, ref_logprobs: Array) -> Array:
    """k2 / mse: ``0.5 * (logp - ref)^2``."""
    return 0.5 * jnp.square(_diff(logprobs, ref_logprobs))


@register("kl", "k3", "low_var_kl")
def kl_k3(logprobs: Array, ref_logprobs: Array) -> Array:
    """k3 / low_var_kl: ``exp(d) - d - 1`` with ``d = clip(ref - logp, -20, 20)``, then
    clipped to ``[0, 10]`` (verl's clamps are [-10, 10]; the value is >= 0, so only the upper
    one bites). Computed as ``expm1(d) - d``: ``exp(d) - 1`` cancels to rounding noise of
    about 6e-8 where the value is d^2 / 2 (|d| = 1e-4: 5e-9), which gave negative tokens
    and a mean of the wrong sign while the policy is near its reference (verl's float32 too);
    below |d| ~ 1e-7 rounding can still leave -1e-14, hence the lower clamp at 0."""
    d = jnp.clip(-_diff(logprobs, ref_logprobs), -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return jnp.clip(jnp.expm1(d) - d, 0.0, K3_VALUE_CLAMP)


def kl_penalty(logprobs: Array, ref_logprobs: Array, kind: str = "k3") -> Array:
    """Per-token KL penalty of the named estimator.

    Formula: see the module docstring; ``kind`` is one of ``k1``/``kl``, ``abs``,
    ``k2``/``mse``, ``k3``/``low_var_kl`` (``kind`` is a Python string, resolved at trace time).

    Source: verl ``core_algos.kl_penalty``, Schulman 2020.

    Shapes: ``logprobs``, ``ref_logprobs`` Float[Array, "B T"] -> Float[Array, "B T"]
    (float32 or wider).

    Deviation: none in value. verl's default kind in the loss is ``low_var_kl`` and in the
    reward ``kl`` (k1); the default here is ``k3``, as for the loss.
    """
    if kind not in available("kl"):
        raise ValueError(
            f"unknown KL estimator {kind!r}; choose one of: {', '.join(available('kl'))}"
        )
    return lookup("kl", kind)(logprobs, ref_logprobs)


def adaptive_kl_coef(
    kl_coef: float | Array,
    current_kl: float | Array,
    n_steps: int | Array,
    *,
    target_kl: float,
    horizon: float,
) -> Array:
    """One update of the adaptive KL coefficient.

    Formula: ``coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)``.

    Source: Ziegler et al. 2019 (arXiv:1909.08593) §2.2; verl ``AdaptiveKLController.update``
    (a stateful class there; a pure function of scalars here).
    """
    error = jnp.clip(jnp.asarray(current_kl) / target_kl - 1.0, -0.2, 0.2)
    return jnp.asarray(kl_coef) * (1.0 + error * n_steps / horizon)
