"""RL run configuration: nested, frozen, gin-configurable dataclasses, one per concern.

gin files override fields (`GRPOConfig.clip_high = 0.28`); anything unknown fails at parse
time. `RLConfig.validate()` checks cross-field rules before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import gin

from jaxrl_llm.config_checks import ConfigError, Ge, checked_fields, documented
from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.learner.algo_config import AlgoConfig
from jaxrl_llm.learner.optim import OptimConfig
from jaxrl_llm.models.lora import LoraConfig
from jaxrl_llm.rewards.config import RewardConfig
from jaxrl_llm.rollout.config import RolloutConfig

__all__ = ["AlgoConfig", "DataConfig", "LoraConfig", "RLConfig", "RewardConfig", "RolloutConfig"]

log = logging.getLogger(__name__)
_DTYPES = ("float32", "bfloat16", "float16")  # a model's dtypes (float64: tests' references)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(dtype=_DTYPES, param_dtype=_DTYPES, rollout_dtype=_DTYPES)
class PolicyConfig:
    """The policy model: its checkpoint, dtypes, how its forwards run, LoRA."""

    checkpoint: str = documented(
        "builtin", "The policy to train: a Hugging Face folder, or 'builtin' for the tiny model."
    )
    critic_checkpoint: str | None = documented(
        None, "The critic's starting weights (GAE only); None: the policy's trunk."
    )
    dtype: str = documented("float32", "Compute dtype of the forwards, e.g. 'bfloat16'.")
    param_dtype: str = documented("float32", "Dtype of the trained (master) weights.")
    rollout_dtype: str | None = documented(
        None, "Dtype of the rollout's copy of the weights, e.g. 'bfloat16'; None: the same weights."
    )
    remat: bool = documented(
        False, "Recompute each layer's activations in the backward pass: less memory, more time."
    )
    scan_layers: bool = documented(
        False,
        "Run the trainer's layers as one lax.scan: compile time independent of depth; slower "
        "to compile and run on CPU (docs/performance.md).",
    )
    pack_sequences: bool = documented(
        True,
        "Pack several samples per row in the trainer's forwards: less padding, same losses; "
        "False: one right-padded sample per row.",
    )
    lora: LoraConfig | None = documented(
        None,
        "Train low-rank adapters on a frozen base (docs/lora.md): `PolicyConfig.lora = "
        "@LoraConfig()`; None: full-parameter training.",
    )


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(  # -1: the rest (all, for devices)
    data=Ge(-1), fsdp=Ge(-1), tensor=Ge(-1), rollout_devices=Ge(0), devices=Ge(-1)
)
class MeshConfig:
    """Device mesh of the trainer: its data, fsdp and tensor axes (one of them may be -1)."""

    data: int = documented(1, "Devices on the data-parallel axis; -1: the devices left over.")
    fsdp: int = documented(
        -1, "Devices the parameters and optimizer state are split over; -1: the devices left over."
    )
    tensor: int = documented(1, "Devices on the tensor-parallel axis; -1: the devices left over.")
    rollout_devices: int = documented(
        0,
        "Devices set apart for the sampler (the last of the run's `devices`; the trainer's "
        "mesh takes the rest): "
        "rollout and training run on their own devices, the weights moved after each update "
        "(timing/weight_sync, weight_sync/bytes); 0: the sampler shares the trainer's devices. "
        "JAX backend, one process.",
    )
    devices: int = documented(
        -1,
        "Devices the run uses, the first ones of this process (the trainer's mesh and "
        "`rollout_devices` come out of them; the rest stay idle), e.g. 1 for a tiny model on a "
        "CPU host simulating several devices; -1: all. One process.",
    )

    def one_process_setting(self) -> tuple[str, int, int] | None:
        """(field, value, the value a multi-host run needs) of the first field set to
        something that runs on one process only so far, or None: devices apart for the
        sampler would take its weights across hosts outside the trainer's collectives (each
        host samples on its own devices instead: `sharding.hosts`), and a run's first
        devices would be the first host's."""
        for name, multi_host in (("rollout_devices", 0), ("devices", -1)):
            if (value := getattr(self, name)) != multi_host:
                return name, value, multi_host
        return None


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(steps=Ge(0), eval_every=Ge(0), save_every=Ge(0), max_staleness=Ge(0))
class RLConfig:
    """An RL run: its length and schedule, composed of one config per concern."""

    name: str = documented("grpo_tiny", "Run name, used in the default run directory.")
    run_dir: str | None = documented(
        None, "Where checkpoints, metrics and samples go; None: `runs/<name>-<timestamp>`."
    )
    steps: int = documented(20, "Training steps.")
    eval_every: int = documented(
        5, "Steps between validations (also before the first and after the last); 0: none."
    )
    save_every: int = documented(5, "Steps between checkpoints (and at the last step); 0: none.")
    seed: int = documented(0, "Seed of the model state, sampling and the critic.")
    max_staleness: int = documented(
        0,
        "Policy versions a sample lags behind the update that trains on it. 0: rollout, then "
        "update, in turn. k >= 1: the next k steps' batches are sampled while the current one "
        "trains, step s always with the weights after s - 1 - k updates (deterministic; none "
        "dropped); pair with `AlgoConfig.is_cap` to correct the lag (learner/overlap.py). "
        "Several processes: each host samples its share (the JAX backend; vLLM is refused).",
    )
    partial_rollouts: bool = documented(
        False,
        "With max_staleness >= 1: a step is sampled with the newest weights computed when "
        "it starts, and samples still decoding when newer ones are computed continue with "
        "them, each token tagged with its version (`Completion.token_versions`); "
        "lower staleness, not reproducible to the digit (the swap points follow timing). "
        "False: a batch finishes with the weights it began with. JAX engine (keeps the KV) "
        "and vLLM (re-submits the response so far).",
    )
    log_generations: int = documented(
        8, "Samples per step written out as text for reading (metrics/generations.py)."
    )
    policy: PolicyConfig = documented(doc="The policy model.", factory=PolicyConfig)
    mesh: MeshConfig = documented(doc="The trainer's device mesh.", factory=MeshConfig)
    data: DataConfig = documented(doc="The prompts.", factory=DataConfig)
    rollout: RolloutConfig = documented(doc="How responses are sampled.", factory=RolloutConfig)
    algo: AlgoConfig = documented(doc="Advantages, losses and updates.", factory=AlgoConfig)
    reward: RewardConfig = documented(doc="How responses are scored.", factory=RewardConfig)
    val_reward: str | None = documented(
        None,
        "A reward that scores validation instead of `reward` (a name as `RewardConfig.name`, "
        "with `reward`'s other settings), e.g. 'math' while training against an 'rm:' model: "
        "a held-out check the training reward cannot be gamed into; None: `reward`.",
    )
    optim: OptimConfig = documented(doc="The policy's optimizer.", factory=OptimConfig)
    critic_optim: OptimConfig = documented(
        doc="The critic's optimizer (GAE). Like `optim` it reads the `OptimConfig.*` bindings; "
        "give the critic its own with a gin scope: `RLConfig.critic_optim = "
        "@critic/OptimConfig()` and `critic/OptimConfig.lr = 1e-5`.",
        factory=OptimConfig,
    )

    def resolved_run_dir(self) -> str:
        if self.run_dir:
            return self.run_dir
        return f"runs/{self.name}-{time.strftime('%Y%m%d-%H%M%S')}"

    @property
    def uses_critic(self) -> bool:
        """Whether the run builds and trains a critic: the estimator's registered
        `needs_critic` (`algorithms.registry.Capabilities`), so an estimator added later that
        reads values gets one without this class knowing its name."""
        from jaxrl_llm.algorithms import registry

        return registry.capabilities("advantage", self.algo.estimator).needs_critic

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

    def validation_reward(self) -> RewardConfig:
        """The `RewardConfig` validation scores with: `reward`, or `val_reward` in its place."""
        if self.val_reward is None:
            return self.reward
        return dataclasses.replace(self.reward, name=self.val_reward, weights=None)

    def validate(self) -> None:
        """Cross-field rules, asked of the registries (what an estimator, loss, tool or
        built-in task needs is registered with it), before any model loads. Every refusal is
        a `ConfigError` (one line from the CLI), the registries' and reward checks' own
        ValueError / KeyError included."""
        try:
            self._validate()
        except ConfigError:
            raise
        except (ValueError, KeyError) as e:  # a registry's or reward's unknown name
            raise ConfigError(e.args[0] if e.args else str(e)) from e

    def _validate(self) -> None:
        from jaxrl_llm.agents.factory import NO_ENV
        from jaxrl_llm.algorithms import registry
        from jaxrl_llm.learner.experience import micro_batch_rows
        from jaxrl_llm.rewards.config import check_rewards
        from jaxrl_llm.tools.factory import NO_TOOL

        _refuse_placeholders(self, "RLConfig")
        a = self.algo
        registry.lookup("advantage", a.estimator)
        registry.lookup("policy_loss", a.policy_loss)
        registry.lookup("loss_agg", a.loss_agg)
        registry.lookup("kl", a.kl_loss_kind)
        registry.lookup("kl", a.kl_in_reward_kind)
        if a.kl_in_reward_target is not None and a.kl_in_reward_coef == 0:
            raise ConfigError(
                "AlgoConfig.kl_in_reward_target adapts kl_in_reward_coef, which is 0 (no KL in "
                "the reward): set kl_in_reward_coef to the starting coefficient"
            )
        batch = self.data.prompts_per_step * self.rollout.n
        micro_batch_rows(a.micro_batch_size, batch, a.mini_batches)  # the experience's and update's
        if self.rollout.temperature <= 0:
            raise ConfigError(
                f"RolloutConfig.temperature = {self.rollout.temperature} (greedy) cannot train: "
                "the PPO ratio needs the sampling distribution's logprobs, log softmax(logits / "
                "temperature); use a temperature > 0 (greedy: val_temperature, eval, generate)"
            )
        _check_tool_settings(self)
        _check_partial_rollouts(self)
        _check_plugins(self.rollout)
        check_rewards(self.reward)  # names, options and `rm:` folders, nothing loaded
        if self.val_reward is not None:
            check_rewards(self.validation_reward(), field="RLConfig.val_reward")
        group = registry.capabilities("advantage", a.estimator).min_group_size
        if self.rollout.n < group:
            raise ConfigError(
                f"estimator {a.estimator!r} needs rollout.n >= {group} samples per prompt (a "
                f"lone sample is its own group baseline), got rollout.n = {self.rollout.n}"
            )
        if not a.mask_tool_output and self.rollout.tool == NO_TOOL and self.rollout.env == NO_ENV:
            log.warning(
                "AlgoConfig.mask_tool_output = False has no effect with RolloutConfig.tool = "
                "'none' and RolloutConfig.env = 'none': no tool output is ever inserted"
            )
        paper_clip = registry.capabilities("policy_loss", a.policy_loss).paper_clip
        # 25x: GSPO's paper range (4e-4) stretched to 0.01; PPO's 0.2 is 500x.
        if paper_clip and max(a.clip_low, a.clip_high) > 25 * max(paper_clip):
            log.warning(
                "policy_loss %r clips its ratio at (1 - %g, 1 + %g): its paper uses %g / %g "
                "(AlgoConfig.clip_low / clip_high); a range this wide almost never clips "
                "(docs/algorithms.md)",
                a.policy_loss,
                a.clip_low,
                a.clip_high,
                *paper_clip,
            )


def _check_tool_settings(cfg: RLConfig) -> None:
    """The settings the tool requires (`tools.factory.BuiltinTool.requires`: the search
    tool's `SearchConfig.corpus`) are set, or stood in for by the built-in task's files
    (`data.tasks.BuiltinTask.supplies`: the retrieval task writes the search tool's corpus)
    when there is no train_file."""
    from jaxrl_llm.data.tasks import builtin_task
    from jaxrl_llm.tools.factory import missing_requirement, tool_settings

    r, d = cfg.rollout, cfg.data
    settings = tool_settings()
    supplied = builtin_task(d.builtin_task).supplies
    if d.train_file is None:
        for field in supplied:
            settings[field] = settings[field] or f"data.builtin_task {d.builtin_task!r}"
    problem = missing_requirement(r.tool, settings)
    if problem:
        raise ConfigError(problem)


def _check_plugins(r: RolloutConfig) -> None:
    """The tool, environment and sampler backend named by import path import and are callable,
    before any model loads or the run folder opens (what they return is checked when built)."""
    from jaxrl_llm.tools.factory import resolve_import_path

    for setting, name in (("tool", r.tool), ("env", r.env), ("backend", r.backend)):
        if ":" in name:
            resolve_import_path(name, f"rollout.{setting}")


def _check_partial_rollouts(cfg: RLConfig) -> None:
    """Partial rollouts need an overlapped run (new weights arrive while a batch samples) and
    a backend that continues samples with them (`rollout.backends.Backend.partial_rollouts`)."""
    from jaxrl_llm.rollout.backends import BACKENDS

    if not cfg.partial_rollouts:
        return
    if cfg.max_staleness < 1:
        raise ConfigError(
            "RLConfig.partial_rollouts needs RLConfig.max_staleness >= 1: a synchronous run "
            "samples every batch with the weights of its own step, none arrive mid-sample"
        )
    backend = BACKENDS.get(cfg.rollout.backend)
    if backend is None or not backend.partial_rollouts:
        able = [name for name, b in BACKENDS.items() if b.partial_rollouts]
        raise ConfigError(
            f"RLConfig.partial_rollouts: rollout.backend = {cfg.rollout.backend!r} does not "
            f"continue running samples with newer weights; backends that do: {able}"
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
            raise ConfigError(
                f"{name} = {value!r} ({where}.{field.name}) is a placeholder left unset: give "
                f"it with --gin_param='{name}=\"...\"' or the macro the gin file's header names"
            )
