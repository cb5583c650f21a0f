"""RL algorithms as pure jax.numpy functions: advantages, losses, KL, aggregation, logprobs.

Shape legend: B batch (prompts x G, groups consecutive), G group size, T tokens, V vocab.
Semantics default to verl's ``core_algos.py``; each docstring states formula, source, shapes and
deviations. ``docs/algorithms.md`` tables the options and other frameworks'
defaults. Configs pick options by name through :mod:`jaxrl_llm.algorithms.registry`.
"""

from jaxrl_llm.algorithms import registry
from jaxrl_llm.algorithms.advantages import (
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from jaxrl_llm.algorithms.aggregation import aggregate_loss, loss_normalizer
from jaxrl_llm.algorithms.kl import adaptive_kl_coef, kl_penalty
from jaxrl_llm.algorithms.logprobs import entropy, head_logprobs, token_logprobs
from jaxrl_llm.algorithms.losses import gspo_policy_loss, policy_loss, value_loss
from jaxrl_llm.algorithms.masked import masked_mean, masked_whiten
from jaxrl_llm.algorithms.off_policy import importance_weights
from jaxrl_llm.algorithms.registry import available, lookup, register, resolve
from jaxrl_llm.algorithms.shaping import kl_shaped_rewards, outcome_token_rewards

__all__ = [
    "adaptive_kl_coef",
    "aggregate_loss",
    "available",
    "entropy",
    "gae_advantages",
    "grpo_advantages",
    "gspo_policy_loss",
    "head_logprobs",
    "importance_weights",
    "kl_penalty",
    "kl_shaped_rewards",
    "lookup",
    "loss_normalizer",
    "masked_mean",
    "masked_whiten",
    "outcome_token_rewards",
    "policy_loss",
    "register",
    "registry",
    "reinforce_pp_advantages",
    "resolve",
    "rloo_advantages",
    "token_logprobs",
    "value_loss",
]
