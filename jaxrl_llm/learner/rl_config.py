"""RL run configuration: nested, frozen, gin-configurable dataclasses, one per concern.

gin files override fields (`GRPOConfig.clip_high = 0.28`); anything unknown fails at parse
time. `RLConfig.validate()` checks cross-field rules before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import gin

from jaxrl_llm.config_checks import Ge, Gt, Interval, checked_fields
from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.learner.optim import OptimConfig
from jaxrl_llm.models.lora import LoraConfig
from jaxrl_llm.rewards.config import RewardConfig
from jaxrl_llm.rollout.config import RolloutConfig

__all__ = ["DataConfig", "LoraConfig", "RLConfig", "RewardConfig", "RolloutConfig"]

log = logging.getLogger(__name__)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields()
class PolicyConfig:
    checkpoint: str = "builtin"  # HF folder or 'builtin'
    critic_checkpoint: str | None = None  # None: the critic starts from the policy trunk
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"  # master weights
    rollout_dtype: str | None = None  # e.g. 'bfloat16' rollout weights; None = same params
    remat: bool = False
    # The layers of the trainer's forwards as one lax.scan (`ModelConfig.scan_layers`): compile
    # time independent of depth; slower to compile and run on XLA:CPU (docs/performance.md).
    scan_layers: bool = False
    # Several samples per row in the trainer's forwards (`learner.packing`): less padding,
    # same losses; False keeps one right-padded sample per row.
    pack_sequences: bool = True
    # Low-rank adapters on a frozen base (`models.lora`, docs/lora.md): only they are
    # trained, checkpointed and synced to the rollout. None: full-parameter training.
    lora: LoraConfig | None = None


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(data=Ge(-1), fsdp=Ge(-1), tensor=Ge(-1))  # -1: the devices left over
class MeshConfig:
    data: int = 1
    fsdp: int = -1
    tensor: int = 1


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
    ppo_epochs=Ge(1),
    mini_batches=Ge(1),
    micro_batch_size=Ge(1),
    value_clip=Ge(0),
    max_sampling_tries=Ge(1),
    tis_cap=Gt(0),
)
class AlgoConfig:
    """Algorithm options, named as in verl. estimator: grpo | rloo | gae | reinforce_plus_plus."""

    estimator: str = "grpo"
    policy_loss: str = "ppo"  # 'ppo' (clipped) | 'gspo'
    loss_agg: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = 3.0
    norm_by_std: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_kind: str = "low_var_kl"
    kl_in_reward_coef: float = 0.0
    kl_in_reward_kind: str = "k1"
    entropy_coef: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer updates per epoch
    micro_batch_size: int = 16  # sequences per forward/backward
    value_clip: float | None = 0.5
    dynamic_sampling: bool = False  # DAPO: drop all-equal groups, refill
    max_sampling_tries: int = 3
    tis_cap: float | None = None  # truncated importance sampling vs rollout logprobs
    overlong_filter: bool = False  # truncated responses excluded from the loss
    # Tool output (retrieved passages, interpreter output) inserted into a response is not
    # the policy's action, so it is masked from the loss (Search-R1, ToRL); False trains on
    # it too: Search-R1's retrieved-token masking ablation (docs/tools.md).
    mask_tool_output: bool = True


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(steps=Ge(0), eval_every=Ge(0), save_every=Ge(0))
class RLConfig:
    name: str = "grpo_tiny"
    run_dir: str | None = None  # None: runs/<name>-<timestamp>
    steps: int = 20
    eval_every: int = 5
    save_every: int = 5
    seed: int = 0
    log_generations: int = 8  # samples per step written as text (metrics/generations.py)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    # Both default to OptimConfig's bindings; give the critic its own with a gin scope:
    # `RLConfig.critic_optim = @critic/OptimConfig()` and `critic/OptimConfig.lr = 1e-5`.
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    critic_optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)

    def resolved_run_dir(self) -> str:
        if self.run_dir:
            return self.run_dir
        return f"runs/{self.name}-{time.strftime('%Y%m%d-%H%M%S')}"

    @property
    def uses_critic(self) -> bool:
        return self.algo.estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """A frozen reference policy is kept when a KL term (loss or reward) is on."""
        return self.algo.use_kl_loss or self.algo.kl_in_reward_coef > 0

    @property
    def seq_len(self) -> int:
        """T of every training row: the longest prompt plus the response budget."""
        return self.data.max_prompt_length + self.rollout.max_new_tokens

    @property
    def cache_len(self) -> int:
        """Rollout KV cache length: `seq_len` plus the position of the last sampled token."""
        return self.seq_len + 1

    def validate(self) -> None:
        from jaxrl_llm.algorithms import registry

        _refuse_placeholders(self, "RLConfig")
        a = self.algo
        registry.lookup("advantage", a.estimator)
        registry.lookup("policy_loss", a.policy_loss)
        registry.lookup("loss_agg", a.loss_agg)
        registry.lookup("kl", a.kl_loss_kind)
        registry.lookup("kl", a.kl_in_reward_kind)
        batch = self.data.prompts_per_step * self.rollout.n
        if batch % a.mini_batches:
            raise ValueError(f"batch {batch} (prompts x n) not divisible by {a.mini_batches=}")
        mini = batch // a.mini_batches
        if mini % a.micro_batch_size and a.micro_batch_size < mini:
            raise ValueError(f"mini-batch {mini} not divisible by {a.micro_batch_size=}")
        if ":" not in self.rollout.tool and self.rollout.tool not in ("none", "python", "search"):
            raise ValueError(
                f"rollout.tool must be 'none', 'python' or 'search', got {self.rollout.tool!r}"
            )
        if self.data.builtin_task not in ("arithmetic", "retrieval"):
            raise ValueError(f"data.builtin_task {self.data.builtin_task!r} is not a built-in task")
        if self.rollout.tool == "search" and not (
            self.rollout.search_corpus
            or (self.data.train_file is None and self.data.builtin_task == "retrieval")
        ):
            raise ValueError("rollout.tool='search' needs rollout.search_corpus (a jsonl corpus)")
        if a.estimator in ("grpo", "rloo") and self.rollout.n < 2:
            raise ValueError(f"{a.estimator} needs rollout.n >= 2 samples per prompt")
        if not a.mask_tool_output and self.rollout.tool == "none":
            log.warning(
                "AlgoConfig.mask_tool_output = False has no effect with RolloutConfig.tool = "
                "'none': no tool output is ever inserted into a response"
            )
        if a.policy_loss == "gspo" and max(a.clip_low, a.clip_high) > 0.01:
            log.warning(
                "GSPO clips a sequence ratio at (1 - %g, 1 + %g): the paper uses 3e-4 / 4e-4 "
                "(AlgoConfig.clip_low / clip_high); 0.2 almost never clips (docs/algorithms.md)",
                a.clip_low,
                a.clip_high,
            )


def _refuse_placeholders(cfg: object, where: str) -> None:
    """The shipped paper configs hold "SET_..." strings where a path must be given; name the
    one left unset (and its override) rather than fail later on a missing file."""
    for field in dataclasses.fields(cfg):  # pyright: ignore[reportArgumentType]
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value):
            _refuse_placeholders(value, f"{where}.{field.name}")
        elif isinstance(value, str) and value.startswith("SET_"):
            name = f"{type(cfg).__name__}.{field.name}"
            raise ValueError(
                f"{name} = {value!r} ({where}.{field.name}) is a placeholder left unset: give "
                f"it with --gin_param='{name}=\"...\"' or the macro the gin file's header names"
            )
