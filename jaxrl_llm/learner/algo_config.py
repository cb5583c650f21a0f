"""The algorithm's options (`AlgoConfig`, named as in verl: docs/algorithms.md), a part of
`RLConfig` (`learner/rl_config.py`), which checks them against the rest of the run."""

from __future__ import annotations

import dataclasses

import gin

from jaxrl_llm.algorithms.off_policy import IS_LEVELS, IS_MODES
from jaxrl_llm.config_checks import ConfigError, Ge, Gt, Interval, checked_fields, documented


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    clip_low=Ge(0),
    clip_high=Ge(0),
    dual_clip_c=Gt(1),
    gamma=Interval(ge=0, le=1),
    lam=Interval(ge=0, le=1),
    kl_loss_coef=Ge(0),
    kl_in_reward_coef=Ge(0),
    kl_in_reward_target=Gt(0),
    kl_in_reward_horizon=Gt(0),
    ppo_epochs=Ge(1),
    mini_batches=Ge(1),
    micro_batch_size=Ge(1),
    value_clip=Ge(0),
    max_sampling_tries=Ge(1),
    is_cap=Gt(0),
    is_floor=Ge(0),
    is_level=IS_LEVELS,
    is_mode=IS_MODES,
)
class AlgoConfig:
    """Algorithm options, named as in verl (docs/algorithms.md)."""

    estimator: str = documented(
        "grpo",
        "Advantage estimator: 'grpo', 'rloo', 'reinforce_plus_plus', "
        "'reinforce_plus_plus_baseline' or 'gae' (trains a critic).",
    )
    policy_loss: str = documented(
        "ppo", "Policy loss: 'ppo' (clipped token ratio) or 'gspo' (clipped sequence ratio)."
    )
    loss_agg: str = documented(
        "token-mean",
        "How token losses become one number: 'token-mean', 'seq-mean-token-sum', "
        "'seq-mean-token-mean' or 'seq-mean-token-sum-norm'.",
    )
    clip_low: float = documented(0.2, "The ratio is clipped below at 1 - clip_low.")
    clip_high: float = documented(
        0.2, "The ratio is clipped above at 1 + clip_high (DAPO's clip-higher raises it)."
    )
    dual_clip_c: float | None = documented(
        3.0,
        "Dual-clip PPO: for a negative advantage A, a token's loss is capped at c * |A|; "
        "None: off.",
    )
    norm_by_std: bool = documented(
        True, "GRPO divides advantages by the group's reward std; False: Dr. GRPO's unscaled."
    )
    gamma: float = documented(1.0, "Discount factor (GAE, REINFORCE++).")
    lam: float = documented(1.0, "GAE's lambda.")
    use_kl_loss: bool = documented(
        False, "Add a KL penalty to the reference policy to the loss (keeps a reference copy)."
    )
    kl_loss_coef: float = documented(0.001, "Weight of the KL loss.")
    kl_loss_kind: str = documented(
        "low_var_kl",
        "KL estimator of the loss: 'k1' ('kl'), 'abs', 'k2' ('mse') or 'k3' ('low_var_kl').",
    )
    kl_in_reward_coef: float = documented(
        0.0, "Weight of a KL penalty subtracted from the reward; 0: off."
    )
    kl_in_reward_kind: str = documented("k1", "KL estimator of the reward penalty (as above).")
    kl_in_reward_target: float | None = documented(
        None,
        "Adaptive KL controller (verl's kl_ctrl.type='adaptive', Ziegler et al. 2019): after "
        "each step the coefficient, starting at kl_in_reward_coef, is scaled by 1 + "
        "clip(KL / target - 1, -0.2, 0.2) * samples / kl_in_reward_horizon; None: fixed.",
    )
    kl_in_reward_horizon: float = documented(
        10000.0, "The adaptive KL controller's horizon, in samples (verl's kl_ctrl.horizon)."
    )
    entropy_coef: float = documented(
        0.0, "Weight of an entropy bonus in the loss; 0: off (entropy is still logged)."
    )
    ppo_epochs: int = documented(1, "Passes over each step's samples.")
    mini_batches: int = documented(
        1, "Optimizer updates per epoch; must divide prompts_per_step x n."
    )
    micro_batch_size: int = documented(
        16, "Sequences per forward/backward; gradients of a mini-batch are accumulated."
    )
    value_clip: float | None = documented(
        0.5, "The critic's value is clipped to within this of its old value; None: off."
    )
    dynamic_sampling: bool = documented(
        False, "DAPO: drop groups whose rewards are all equal and sample more prompts to refill."
    )
    max_sampling_tries: int = documented(
        3, "Most rollout batches a step draws while dynamic sampling refills."
    )
    is_cap: float | None = documented(
        None,
        "Off-policy correction: weight each token's advantage by the trainer/sampler "
        "probability ratio (algorithms/off_policy.py), truncated at (or masked above) this "
        "cap; None: off.",
    )
    is_level: str = documented(
        "token", "Ratio of the correction: 'token', 'sequence' or 'geometric' (per-token mean)."
    )
    is_mode: str = documented(
        "truncate",
        "'truncate' (TIS: min(w, cap)) or 'mask' (MIS: a token, or with is_level 'sequence' "
        "or 'geometric' a sequence, whose w is outside [is_floor, cap] leaves the loss mask: "
        "policy loss, its normaliser, KL loss and entropy).",
    )
    is_floor: float = documented(0.0, "Lower bound of the 'mask' mode's weights.")
    overlong_filter: bool = documented(
        False,
        "Leave responses cut at the token budget out of the loss (DAPO); their scores still "
        "count in their group's advantage baseline.",
    )
    # Tool output is not the policy's action, so Search-R1 and ToRL mask it from the loss.
    mask_tool_output: bool = documented(
        True,
        "Mask tool output inserted into a response from the loss; False trains on it too "
        "(Search-R1's masking ablation, docs/agents.md).",
    )

    def __post_init__(self):
        if self.is_cap is not None and self.is_floor > self.is_cap:
            raise ConfigError(
                f"AlgoConfig.is_floor = {self.is_floor} is above is_cap = {self.is_cap}: "
                "the 'mask' mode keeps weights in [is_floor, is_cap]"
            )
