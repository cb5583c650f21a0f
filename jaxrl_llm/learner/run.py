"""What an RL run is built from: the learner (models on the mesh, optimisers, jitted steps),
prompt data, the rollout stage, the reward pool and the checkpointer, restored on resume.

`build_run(cfg)` constructs; `rl_loop.train(run)` runs. `bench rl-step` builds the same
learner to time its kernels alone.

The run directory may be a `gs://` path: every file the run writes goes through
`etils.epath` there, except the built-in task's generated prompts (deterministic from the
seed, read by the data pipeline as local files), which go to a local temporary folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.pipeline import PromptIterator
from jaxrl_llm.data.prompts import PromptData, check_data_files, check_template, prompt_data
from jaxrl_llm.learner import ahead as ahead_lib
from jaxrl_llm.learner import lora as lora_lib
from jaxrl_llm.learner.checkpoint import Checkpointer, base_identity, check_base, nothing_to_resume
from jaxrl_llm.learner.compile_ahead import UpdateCompiler
from jaxrl_llm.learner.experience import make_experience_fn
from jaxrl_llm.learner.optim import make_optimizer
from jaxrl_llm.learner.rl_config import MeshConfig, RLConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import (
    exactly_on_policy,
    make_critic_step,
    make_micro_batch_fn,
    make_policy_step,
)
from jaxrl_llm.metrics.generations import GenerationLog
from jaxrl_llm.metrics.writer import MetricsConfig
from jaxrl_llm.models import ValueModel, from_pretrained, load_tokenizer
from jaxrl_llm.models.config import CheckpointError, ModelConfig
from jaxrl_llm.models.hf_files import read_config
from jaxrl_llm.models.lora import int8_weights
from jaxrl_llm.rewards.config import build_rewards
from jaxrl_llm.rewards.pool import Scorer
from jaxrl_llm.rollout.judge import build_judge
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
from jaxrl_llm.sharding.hosts import local_sampling_mesh
from jaxrl_llm.sharding.mesh import run_devices, sampler_mesh_shape

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunState:
    """What a checkpoint restores: device state plus host counters."""

    policy: TrainState
    critic: TrainState | None
    step: int = 0
    # The adaptive KL controller's weight of the KL in the reward for the next step
    # (`AlgoConfig.kl_in_reward_target`, `rl_loop.adapt_kl_coef`), saved in the checkpoint's
    # extra; None: a fixed weight, the config's `kl_in_reward_coef`.
    kl_coef: float | None = None


@dataclasses.dataclass
class Learner:
    """A run's models on the mesh and the jitted functions over them."""

    mesh: Mesh
    tokenizer: Any
    policy: Any  # the CausalLM module; the rollout engine is built from it
    graphdef: nnx.GraphDef
    state: RunState
    ref_params: Any | None  # frozen reference policy when a KL term is on
    frozen: Any | None  # with LoRA: the frozen base weights (the train state holds adapters)
    policy_step: Callable
    critic_step: Callable | None
    experience_fn: Callable  # `experience.make_experience_fn`
    micro_batches: Callable  # `steps.make_micro_batch_fn`
    on_policy: bool  # `steps.exactly_on_policy`: no old-logprob forward
    checkpoint: Path  # the HF folder the policy was loaded from (a server sampler loads it)
    sampling_mesh: Mesh | None = None  # the sampler's own devices (`MeshConfig.rollout_devices`)
    # The update's programs compiled while the experience pass runs (`compile_ahead`).
    compiler: UpdateCompiler = dataclasses.field(default_factory=UpdateCompiler)

    def policy_params(self) -> Any:
        """The policy's whole State: the trained params, plus the frozen base with LoRA."""
        return lora_lib.full_params(self.state.policy.params, self.frozen)


RL_SAMPLE = "DataConfig.max_prompt_length + RolloutConfig.max_new_tokens"


def check_context(seq_len: int, src: str | os.PathLike, what: str = RL_SAMPLE) -> None:
    """A sample's positions (`seq_len`: for RL, prompt and response, `RLConfig.seq_len`) must
    be ones the model at `src` was trained on, `max_position_embeddings` of its config.json:
    past it RoPE gives angles the model never saw. Refused with plain rotary embeddings;
    warned with a RoPE scaling, which may extend the context beyond that field. `what`: the
    settings that make up `seq_len`, named in the message. Reads config.json only."""
    model = ModelConfig.from_hf(read_config(src))
    limit = model.max_position_embeddings
    if seq_len <= limit:
        return
    what = (f"{what} = {seq_len} tokens exceed the model's context ({src}: "
            f"max_position_embeddings = {limit})")  # fmt: skip
    if model.rope.type != "default":
        log.warning("%s; its RoPE scaling (%r) may cover them", what, model.rope.type)
        return
    raise ConfigError(f"{what}: lower them, or use a checkpoint with a longer context")


def build_learner(cfg: RLConfig, tokenizer: Any = None) -> Learner:
    """Load the policy (and critic) straight into the training layout; build the steps.
    `tokenizer`: the policy checkpoint's, when the caller has loaded it already. The
    sample's length against the model's context is `build_run`'s check, before any folder
    opens (`bench rl-step` builds a learner for a config `run_rl` has run)."""
    mesh, sampling_mesh = _meshes(cfg.mesh)
    src = resolve_checkpoint(cfg.policy.checkpoint, "PolicyConfig.checkpoint")
    load = functools.partial(
        from_pretrained,
        dtype=cfg.policy.dtype,
        param_dtype=cfg.policy.param_dtype,
        mesh=mesh,
        rules=TRAIN_RULES,
    )
    policy = load(
        src,
        remat=cfg.policy.remat,
        scan_layers=cfg.policy.scan_layers,
        quantize=int8_weights(cfg.policy.lora),  # an int8 LoRA base: quantised as read
    )
    graphdef, params, frozen, ref_params = lora_lib.split_trainable(
        policy, cfg.policy.lora, seed=cfg.seed, reference=cfg.needs_reference
    )
    a = cfg.algo
    budget = cfg.rollout.max_new_tokens  # a response's tokens: Dr.GRPO's divisor
    updates = cfg.steps * a.ppo_epochs * a.mini_batches
    tx = make_optimizer(cfg.optim, updates)
    state = RunState(TrainState.create(params, tx, jax.random.PRNGKey(cfg.seed)), None)
    if a.kl_in_reward_target is not None:
        state.kl_coef = a.kl_in_reward_coef  # the controller's start
    critic_step = critic_graphdef = None
    if cfg.uses_critic:
        critic_src = resolve_checkpoint(
            cfg.policy.critic_checkpoint or cfg.policy.checkpoint,
            "PolicyConfig.critic_checkpoint",
            tokenizer=False,
        )
        critic = load(critic_src, cls=ValueModel)
        critic_graphdef, critic_params = nnx.split(critic)
        ctx_ = make_optimizer(cfg.critic_optim, updates)
        state.critic = TrainState.create(critic_params, ctx_, jax.random.PRNGKey(cfg.seed + 1))
        critic_step = make_critic_step(critic_graphdef, ctx_, a, response_budget=budget)
    on_policy = exactly_on_policy(a)
    temperature = cfg.rollout.temperature
    experience_fn = make_experience_fn(
        graphdef, critic_graphdef, a, temperature=temperature, group_size=cfg.rollout.n,
        micro_batch=a.micro_batch_size, old_logprobs=not on_policy, mesh=mesh,
    )  # fmt: skip
    return Learner(
        mesh=mesh,
        tokenizer=load_tokenizer(src) if tokenizer is None else tokenizer,
        policy=policy,
        graphdef=graphdef,
        state=state,
        ref_params=ref_params,
        frozen=frozen,
        policy_step=make_policy_step(
            graphdef, tx, a, temperature, on_policy=on_policy, response_budget=budget
        ),
        critic_step=critic_step,
        experience_fn=experience_fn,
        micro_batches=make_micro_batch_fn(mesh, a.micro_batch_size),
        on_policy=on_policy,
        checkpoint=Path(src),
        sampling_mesh=sampling_mesh,
    )


def _check_one_process(cfg: RLConfig) -> None:
    """A setting that runs on one process only so far (`MeshConfig.one_process_setting`),
    refused before anything loads."""
    n, found = jax.process_count(), cfg.mesh.one_process_setting()
    if n > 1 and found is not None:
        name, value, multi_host = found
        raise ConfigError(f"MeshConfig.{name} = {value} runs on one process only so far "
                          f"(this run has {n}); use {multi_host} for multi-host runs")  # fmt: skip


def _meshes(m: MeshConfig) -> tuple[Mesh, Mesh | None]:
    """The trainer's mesh, and the sampler's when `m.rollout_devices` sets the last of the
    run's devices (`m.devices`) apart for it (its "tensor" axis as the trainer's when that
    divides them, else 1)."""
    devices, r = run_devices(m.devices), m.rollout_devices
    if not r:
        return build_mesh(m.data, m.fsdp, m.tensor, devices=devices), None
    if r >= len(devices):
        raise ConfigError(
            f"MeshConfig.rollout_devices = {r} needs more devices than that (this run has "
            f"{len(devices)}): the trainer takes the rest"
        )
    train = build_mesh(m.data, m.fsdp, m.tensor, devices=devices[:-r])
    return train, build_mesh(*sampler_mesh_shape(r, m.tensor), devices=devices[-r:])


@dataclasses.dataclass
class Run:
    """Everything a training run is built from; `train(run)` runs it."""

    cfg: RLConfig
    run_dir: epath.Path  # local or a URI (gs://)
    learner: Learner
    data: PromptData
    prompts: PromptIterator  # the train pipeline's iterator (its state is checkpointed)
    rollout: RolloutStage
    reward: Scorer  # a RewardPool, or with `rm:` rewards a ModelAndRuleRewards
    ckpt: Checkpointer
    resumed: bool
    generations: GenerationLog  # each step's samples as text (run_dir/generations/)
    # A cloud run's local folder for the built-in task's files, removed with the Run.
    scratch: tempfile.TemporaryDirectory | None = None
    # Batches the checkpoint resumed from had sampled ahead (`learner/ahead.py`), by step:
    # trained before anything is sampled.
    ahead: dict[int, ahead_lib.Batch] = dataclasses.field(default_factory=dict)
    # What scores validation when `RLConfig.val_reward` is set; None: `reward`.
    val_reward: Scorer | None = None


class RunDirInUseError(ConfigError, FileExistsError):
    """The run directory holds another run's checkpoints and `--resume` was not given."""


def build_run(cfg: RLConfig, *, resume: bool = False) -> Run:
    """Models, data, rollout stage, reward pool and checkpointer; with `resume`, the latest
    checkpoint restored (a run directory with checkpoints and no `resume` is an error)."""
    cfg.validate()
    check_data_files(cfg.data)  # a wrong path fails before the model loads
    _check_one_process(cfg)
    src = resolve_checkpoint(cfg.policy.checkpoint, "PolicyConfig.checkpoint")
    tokenizer = load_tokenizer(src)
    # 'chat' on a base model's tokenizer, a sample past the context: before any folder opens
    check_template(cfg.data, tokenizer)
    check_context(cfg.seq_len, src)
    run_dir = epath.Path(cfg.resolved_run_dir())
    ckpt, step0 = _open_checkpoints(cfg, run_dir, resume)
    try:
        learner = build_learner(cfg, tokenizer)
        data_root, scratch = _data_root(run_dir)
        data = prompt_data(cfg.data, learner.tokenizer, data_root)
        prompts = data.train.iterator()
        state = learner.state
        ahead: dict[int, ahead_lib.Batch] = {}
        if step0 is not None:
            restored, extra = ckpt.restore(step0, device_state(state))
            state.policy, state.critic = restored["policy"], restored.get("critic")
            ahead = _restore_data(prompts, extra, ckpt.directory / str(step0), run_dir)
            ahead_lib.check_group_size(ahead, cfg.rollout.n, ckpt.directory / str(step0))
            state.step = step0
            if state.kl_coef is not None:  # where it stopped (none saved: the start)
                state.kl_coef = float(extra.get("kl_in_reward_coef", state.kl_coef))
            log.info("resumed from %s step %d", ckpt.directory, step0)
    except BaseException:
        ckpt.close()
        raise
    rollout = RolloutStage(
        cfg.rollout, learner.policy, learner.tokenizer, learner.mesh,
        max_prompt_length=cfg.data.max_prompt_length, seed=cfg.seed,
        rollout_dtype=cfg.policy.rollout_dtype, corpus=data.corpus,
        checkpoint=learner.checkpoint, sampling_mesh=learner.sampling_mesh,
    )  # fmt: skip
    built: list[Scorer] = []  # closed if a later part fails: pools and judges' engines
    try:  # the sampler may hold an engine (vLLM) and the tool workers: never leaked
        # Reward models and judges score on this host's sampling devices, outside any
        # collective: each host scores its own samples, in batches of its own.
        scoring = local_sampling_mesh(learner.sampling_mesh or learner.mesh)
        reward = build_rewards(cfg.reward, mesh=scoring, judges=build_judge)
        built.append(reward)
        val_reward = None
        if cfg.val_reward is not None:
            val_reward = build_rewards(cfg.validation_reward(), mesh=scoring, judges=build_judge)
            built.append(val_reward)
        generations = GenerationLog(
            run_dir, cfg.log_generations, learner.tokenizer,
            tensorboard=MetricsConfig().tensorboard,  # as the metrics writer reads it
        )  # fmt: skip
    except BaseException:
        with contextlib.ExitStack() as stack:
            for close in (rollout.close, ckpt.close, *(b.close for b in built)):
                stack.callback(close)
        raise
    return Run(
        cfg, run_dir, learner, data, prompts, rollout, reward, ckpt, resume, generations, scratch,
        ahead, val_reward,
    )  # fmt: skip


def _restore_data(
    prompts: PromptIterator, extra: dict[str, Any], step_dir: epath.Path, run_dir: epath.Path
) -> dict[int, ahead_lib.Batch]:
    """Continue `prompts` where checkpoint `step_dir` left them; the batches it had sampled
    ahead. A checkpoint of other data (another file, size, seed or pipeline setting) is
    refused as the iterator refuses it, in one line with the fix."""
    try:
        prompts.set_state(extra["data"])
        return dict(ahead_lib.decode(record) for record in extra.get("ahead", []))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {step_dir} cannot continue with this run's data ({e}); resume with "
            f"the data settings it was saved with (DataConfig, as in {run_dir / 'config.gin'}),"
            " or start a new run_dir"
        ) from e


def _open_checkpoints(
    cfg: RLConfig, run_dir: epath.Path, resume: bool
) -> tuple[Checkpointer, int | None]:
    """The run's checkpointer, recording the policy's base (`checkpoint.base_identity`) in
    every save, and the step to resume from (None: a fresh start). A run directory with
    checkpoints needs `resume`; with it, a base of another model config than the
    checkpoint's is refused here, before any model loads, and so is another base when its
    weights are part of the resumed run (a LoRA run's frozen base, or a KL term's
    reference)."""
    # A resume creates no folder: with no checkpoint to continue, it is refused (nothing written).
    ckpt = Checkpointer(run_dir / "checkpoints", create=not resume)
    try:
        step0 = ckpt.latest_step()
        _check_incomplete(ckpt, step0, run_dir, resume)
        src = resolve_checkpoint(cfg.policy.checkpoint, "PolicyConfig.checkpoint")
        ckpt.base = base_identity(src, cfg.policy)
        if step0 is not None:
            check_base(
                ckpt.read_extra(step0).get("base"), ckpt.base, field="PolicyConfig.checkpoint",
                step_dir=str(ckpt.directory / str(step0)), loaded_as=cfg.policy.lora is not None,
                weights=cfg.policy.lora is not None or cfg.needs_reference,
            )  # fmt: skip
    except BaseException:
        ckpt.close()
        raise
    return ckpt, step0


def _check_incomplete(
    ckpt: Checkpointer, step0: int | None, run_dir: epath.Path, resume: bool
) -> None:
    """Without `resume`, refuse a run directory with step folders, complete or not. With it,
    refuse a run with no complete step (starting over would replace its metrics and hf/),
    and an incomplete step after `step0` (the latest complete one): the resumed run's saves
    would meet its folder (Orbax refuses a step it lists) after the steps between."""
    incomplete = ckpt.incomplete_steps()
    if resume and step0 is None:
        raise nothing_to_resume(ckpt.directory, incomplete)
    if not resume and (step0 is not None or incomplete):
        what = f"step {step0}" if step0 is not None else f"incomplete steps {sorted(incomplete)}"
        raise RunDirInUseError(
            f"run_dir {run_dir} already has checkpoints ({what}): pass --resume to "
            "continue that run, or choose another run_dir (--run_dir / RLConfig.run_dir)"
        )
    after = sorted(s for s in incomplete if step0 is not None and s > step0)
    if resume and after:
        folder = ckpt.directory / str(after[0])
        raise CheckpointError(
            f"checkpoint {folder} is incomplete (no {incomplete[after[0]]}): move it aside (mv "
            f"{folder} {folder}.incomplete) and resume again, from step {step0}, the latest "
            "complete one; it is not skipped here, as this run's saves would meet it"
        )


def _data_root(run_dir: epath.Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """Where the built-in task's files go: the run directory when local, else a temporary
    local folder (the pipelines read local files; the task is regenerated from its seed on
    resume, so nothing is lost)."""
    if "://" not in os.fspath(run_dir):
        return Path(os.fspath(run_dir)), None
    scratch = tempfile.TemporaryDirectory(prefix="jaxrl-run-")
    return Path(scratch.name), scratch


def device_state(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": state.policy}
    if state.critic is not None:
        out["critic"] = state.critic
    return out
