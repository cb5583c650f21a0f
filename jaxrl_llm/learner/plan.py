"""Bytes per device of an RL run, before launch, without allocating anything (`jaxrl-llm plan`,
`learner.plan_cli`).

Parameter shapes come from `nnx.eval_shape` of the model; each array's per-device shard comes
from its logical axes, the rule tables and an `AbstractMesh` of the requested size (the same
`logical_to_spec` the run uses, so a dimension the mesh does not divide stays whole).

Terms (per device; `T` = max_prompt_length + max_new_tokens):

- policy: parameters (TRAIN_RULES) and AdamW's two moments (2x, in param dtype);
- gradients: GRAD_COPIES x parameters: the gradient plus two parameter-sized temporaries of
  the update (`updates` and the finite-or-skip `where`);
- reference model (when a KL term is used): parameters again; critic (estimator 'gae'):
  a `ValueModel`'s parameters, moments and gradients; `rm:` reward models and `judge:`
  judges: their weights, resident, and one scorer's scoring activations or KV pool in the
  rollout phase (`learner.plan_rewards`);
- KV cache: the engine's paged pool, max_slots x ceil(cache length / page size) pages of
  keys and values in the compute dtype (cache length = max_prompt_length + max_new_tokens
  + 1), split over the batch axes when they divide max_slots (the engine's rule) and over
  kv heads (tensor); plus a copy of the weights in the sampling layout when it differs from
  the training layout (fsdp > 1);
- where the sampler and the scorers live: on the trainer's mesh with one process; with
  several (`devices_per_host`), on each host's own mesh (`plan_shapes.host_mesh_shape`, as
  `hosts.local_sampling_mesh`), the sampler's weights always a copy (the host-replicated
  gather); with devices set apart for the sampler (`MeshConfig.rollout_devices`), on those
  devices only (`Plan.sampler_terms`, on the sampler's own mesh: weights always a copy, KV
  pool, reward models and judges), and the trainer's devices hold none of them;
- vLLM (`RolloutConfig.backend = "vllm"`): no JAX pool or copy; vLLM reserves
  `VllmConfig.gpu_memory_utilization` x device memory for the whole run (unknown, and
  the verdict too, without a device memory figure);
- batch: the 8 float32/int32 arrays of a `TrainBatch`, [B, T] from the experience pass
  (held through every update: whole on one device with one process, where the experience
  pass leaves it; rows over ("data", "fsdp") when they divide, with several) and one
  [M, mb, T] mini-batch cut from it (rows over ("data", "fsdp") when mb divides);
- activations of one micro-batch, with and without remat, plus FSDP's all-gathered weights
  (`learner.plan_activations`: the fitted formula, and its known gap under remat on CPU).

Not counted: the experience forwards (forward-only, smaller than the update), XLA's workspace
and compiled code; `HEADROOM` leaves room for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_llm.learner.plan_activations import activation_bytes, gathered_bytes
from jaxrl_llm.learner.plan_lora import adapter_bytes, int8_base_saving, lora_activation_bytes
from jaxrl_llm.learner.plan_rewards import ScorerLoad, scorer_loads, scorers_memory
from jaxrl_llm.learner.plan_shapes import (
    abstract_mesh,
    host_mesh_shape,
    kv_pool_bytes,
    param_bytes,
    sampler_copy_bytes,
)
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.mesh import sampler_mesh_shape
from jaxrl_llm.sharding.rules import SAMPLE_RULES, TRAIN_RULES

GB = 1e9
HEADROOM = 0.10  # fraction of device memory left for XLA workspace, code and fragmentation
GRAD_COPIES = 2.6  # fitted; floor 2: the gradient and the update
MOMENTS = 2  # AdamW
# What devices set apart for the sampler hold (`MeshConfig.rollout_devices`): its weights
# and KV pool, and the scorers `run.build_run` loads on the sampler's mesh.
SAMPLER_KEYS = ("rollout_weights", "kv_cache", "reward_models", "judges", "scoring")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the run does per step, in the numbers memory depends on."""

    micro_batch: int  # sequences per forward/backward
    seq_len: int  # T = max_prompt_length + max_new_tokens
    micro_batches: int = 1  # M per optimiser update
    slots: int = 0  # concurrent decode slots
    cache_len: int = 0  # max_prompt_length + max_new_tokens + 1
    reference: bool = False
    critic: bool = False
    lora: Any = None  # `models.lora.LoraConfig`: only adapters trained, reference = base
    # `RLConfig.max_staleness`: k >= 1 samples while it trains (rollout and train phases at
    # once) and holds up to k + 1 copies of the trained params for the sampler.
    max_staleness: int = 0
    # Each `rm:` reward model and `judge:` judge the run loads.
    scorers: tuple[ScorerLoad, ...] = ()
    # The sampler's copy: `PolicyConfig.rollout_dtype` and `RolloutConfig.weights`.
    rollout_dtype: str | None = None
    sampler_weights: str = "same"
    kv_cache_dtype: str = "auto"  # `RolloutConfig.kv_cache_dtype`
    # `MeshConfig.rollout_devices` and the sampler's mesh on them (`sampler_mesh_shape`).
    rollout_devices: int = 0
    sampler_mesh: tuple[int, int, int] = (1, 1, 1)
    samples: int = 0  # B = prompts_per_step x n: rows of the experience batch
    backend: str = "jax"  # `RolloutConfig.backend`
    vllm_memory_utilization: float = 0.0  # `VllmConfig.gpu_memory_utilization` with 'vllm'

    @classmethod
    def from_rl_config(cls, cfg: Any) -> Workload:
        a, d, r = cfg.algo, cfg.data, cfg.rollout
        mini = d.prompts_per_step * r.n // a.mini_batches
        mb = min(a.micro_batch_size, mini)
        return cls(
            micro_batch=mb,
            seq_len=cfg.seq_len,
            micro_batches=max(mini // mb, 1),
            slots=r.max_slots,
            cache_len=cfg.cache_len,
            reference=cfg.needs_reference,
            critic=cfg.uses_critic,
            lora=cfg.policy.lora,
            max_staleness=cfg.max_staleness,
            scorers=scorer_loads(cfg),
            rollout_dtype=cfg.policy.rollout_dtype,
            sampler_weights=r.weights,
            kv_cache_dtype=r.kv_cache_dtype,
            rollout_devices=(apart := cfg.mesh.rollout_devices),
            sampler_mesh=sampler_mesh_shape(apart, cfg.mesh.tensor) if apart else (1, 1, 1),
            samples=d.prompts_per_step * r.n,
            backend=r.backend,
            vllm_memory_utilization=_vllm_share(r.backend),
        )


def _vllm_share(backend: str) -> float:
    from jaxrl_llm.rollout.config import VllmConfig

    return VllmConfig().gpu_memory_utilization if backend == "vllm" else 0.0


def _sampling_copy_bytes(cfg, mesh, w: Workload, *, apart: bool = False) -> int:
    """Bytes of the rollout's weight copy: zero when the layouts agree and nothing is cast
    or quantised (weight sync is a pointer), else the sampler's params in the sampling
    layout, at `rollout_dtype`, int8 weights one byte each; always a copy on devices
    `apart` from the trainer's."""
    int8 = w.sampler_weights != "same"
    if not apart and mesh.shape["fsdp"] == 1 and w.rollout_dtype is None and not int8:
        return 0
    return sampler_copy_bytes(cfg, mesh, SAMPLE_RULES, w.rollout_dtype, int8)


@dataclasses.dataclass
class Plan:
    """Bytes per device, by term; `peak` = resident + max(train phase, rollout phase), or
    their sum when the rollout overlaps training (`Workload.max_staleness`). With devices
    set apart for the sampler, `sampler_terms` are each of those devices' bytes, and `peak`
    is the larger of the two kinds of device. `host_mesh`: each host's sampling mesh in a
    run of several processes."""

    model: dict
    mesh: dict
    workload: dict
    terms: dict[str, int]
    activations_no_remat: int
    activations_remat: int
    remat: bool
    device_memory: float | None = None
    suggestions: list[dict] = dataclasses.field(default_factory=list)
    sampler_terms: dict[str, int] = dataclasses.field(default_factory=dict)
    host_mesh: dict | None = None

    @property
    def resident(self) -> int:
        keys = ("params", "optimizer", "reference", "critic_params", "critic_optimizer",
                "overlap_weights", "reward_models", "judges", "vllm")  # fmt: skip
        return sum(self.terms[k] for k in keys)

    @property
    def vllm_unknown(self) -> bool:
        """vLLM's reservation is a share of a device memory the plan was not given."""
        return self.workload.get("backend") == "vllm" and self.device_memory is None

    @property
    def train_phase(self) -> int:
        return sum(self.terms[k] for k in ("grads", "critic_grads", "batch", "activations"))

    @property
    def rollout_phase(self) -> int:
        """Sampling, then scoring (the sampler's weight copy held through both)."""
        t = self.terms
        return t["rollout_weights"] + max(t["kv_cache"], t["scoring"])

    @property
    def train_step(self) -> int:
        """What XLA's memory analysis of the policy step covers."""
        t = self.terms
        return t["params"] + t["optimizer"] + t["grads"] + t["batch"] + t["activations"]

    @property
    def trainer_peak(self) -> int:
        if self.workload.get("max_staleness"):  # overlapped: both phases at once
            return self.resident + self.train_phase + self.rollout_phase
        return self.resident + max(self.train_phase, self.rollout_phase)

    @property
    def sampler_peak(self) -> int:
        """A sampler device's bytes (0 without devices set apart for it): its weights and
        scorers resident, then sampling, then scoring."""
        s = self.sampler_terms
        if not s:
            return 0
        resident = s["rollout_weights"] + s["reward_models"] + s["judges"]
        return resident + max(s["kv_cache"], s["scoring"])

    @property
    def peak(self) -> int:
        return max(self.trainer_peak, self.sampler_peak)

    @property
    def fits(self) -> bool | None:
        if self.device_memory is None:
            return None
        return self.peak <= (1 - HEADROOM) * self.device_memory

    def to_json(self) -> dict:
        """The plan as JSON values; `bytes_per_device` are a trainer device's (every device's
        without `rollout_devices`), `bytes_per_sampler_device` a sampler device's."""
        sampler = {**self.sampler_terms, "peak": self.sampler_peak} if self.sampler_terms else {}
        return {
            "model": self.model,
            "mesh": self.mesh,
            "workload": self.workload,
            "bytes_per_device": {
                **self.terms,
                "activations_no_remat": self.activations_no_remat,
                "activations_remat": self.activations_remat,
                "resident": self.resident,
                "train_phase": self.train_phase,
                "rollout_phase": self.rollout_phase,
                "peak": self.trainer_peak,
            },
            **({"bytes_per_sampler_device": sampler} if sampler else {}),
            **({"host_mesh": self.host_mesh} if self.host_mesh else {}),
            "peak": self.peak,
            "remat": self.remat,
            "device_memory": self.device_memory,
            "fits": self.fits,
            "suggestions": self.suggestions,
        }

    def table(self) -> str:
        sums = ("resident", "train_phase", "rollout_phase", "peak")
        rows = [*self.terms.items(), ("activations (no remat)", self.activations_no_remat),
                ("activations (remat)", self.activations_remat)]  # fmt: skip
        rows += [(f"= {k.replace('_', ' ')}", getattr(self, k)) for k in sums]
        m = self.model
        lines = [
            f"{m['name']}: {m['params'] / 1e9:.2f} B params, dtype {m['dtype']}, "
            f"params {m['param_dtype']}, remat {self.remat}",
            "mesh "
            + " x ".join(f"{k}={v}" for k, v in self.mesh.items())
            + (" (the trainer's devices)" if self.sampler_terms else ""),
        ]
        if self.host_mesh:
            shape = " x ".join(f"{k}={v}" for k, v in self.host_mesh.items())
            lines.append(f"each host's sampler and scorers on its own mesh {shape}")
        lines.append(f"{'term':<24}{'GB / device':>12}")
        lines += [f"{name:<24}{value / GB:>12.3f}" for name, value in rows]
        if self.sampler_terms:
            shape = " x ".join(map(str, self.workload["sampler_mesh"]))
            lines.append(f"sampler devices ({self.workload['rollout_devices']}, mesh {shape}):")
            sampler = [*self.sampler_terms.items(), ("= peak", self.sampler_peak)]
            lines += [f"{name:<24}{value / GB:>12.3f}" for name, value in sampler]
        if self.vllm_unknown:
            share = self.workload["vllm_memory_utilization"]
            lines.append(
                f"vLLM reserves {share} of each device's memory (VllmConfig."
                "gpu_memory_utilization), not counted above: the device's memory is unknown; "
                "pass --device-memory-gb for a verdict"
            )
        if self.device_memory is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"device {self.device_memory / GB:.1f} GB (usable "
                f"{(1 - HEADROOM) * self.device_memory / GB:.1f}): {verdict}"
            )
        for s in self.suggestions:
            ok = "fits" if s["fits"] else "still over"
            lines.append(f"  try {s['change']}: peak {s['peak'] / GB:.2f} GB ({ok})")
        return "\n".join(lines)


def batch_bytes(mesh, w: Workload) -> int:
    """The update's `TrainBatch` arrays on the most loaded device: the [B, T] experience
    batch (rows over ("data", "fsdp") when they divide, `hosts.batch_sharding`, as the
    experience pass places them) and one [M, mb, T] mini-batch
    (`steps.make_micro_batch_fn`: rows over ("data", "fsdp") when mb divides)."""
    split = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = lambda n: n // split if n % split == 0 else n
    full = rows(w.samples) * w.seq_len
    mini = w.micro_batches * rows(w.micro_batch) * w.seq_len
    return 8 * 4 * (full + mini)  # 8 float32/int32 arrays


def _sampler_side(cfg, shape, w: Workload, device_memory, *, apart: bool) -> dict[str, int]:
    """The rollout's and the scorers' terms on the mesh of `shape` they run on; `apart`:
    not the trainer's devices or layout, so the sampler's weights are always a copy."""
    sampling = abstract_mesh(*shape)
    jax_engine = w.backend != "vllm" and w.slots
    kv = kv_pool_bytes(cfg, sampling, w.slots, w.cache_len, w.kv_cache_dtype) if jax_engine else 0
    copy = _sampling_copy_bytes(cfg, sampling, w, apart=apart) if jax_engine else 0
    vllm = w.vllm_memory_utilization * device_memory if w.backend == "vllm" and device_memory else 0
    return {
        "kv_cache": kv,
        "rollout_weights": copy,
        "vllm": int(vllm),
        **scorers_memory(w.scorers, sampling, cfg.dtype),
    }


def plan_memory(
    cfg, mesh_shape, w: Workload, *, name="model", device_memory=None, devices_per_host=None
) -> Plan:
    """Per-device memory of policy (+ reference, critic), rollout cache, scorers and one
    update; `devices_per_host` below the mesh's size: several processes, each host sampling
    and scoring on its own devices."""
    from jaxrl_llm.models import ValueModel

    mesh = abstract_mesh(*mesh_shape)
    devices, host = int(np.prod(mesh_shape)), None
    if devices_per_host and devices_per_host < devices:  # several processes
        host = host_mesh_shape(devices, devices_per_host, mesh_shape[2])
    params, count = param_bytes(cfg, mesh, TRAIN_RULES)
    critic = param_bytes(cfg, mesh, TRAIN_RULES, ValueModel)[0] if w.critic else 0
    # Run.build_run: the scorers on `local_sampling_mesh(sampling mesh or trainer mesh)`.
    shape = w.sampler_mesh if w.rollout_devices else host or tuple(mesh_shape)
    apart = bool(w.rollout_devices) or host is not None
    side = _sampler_side(cfg, shape, w, device_memory, apart=apart)
    act = {
        r: activation_bytes(cfg, mesh, w.micro_batch, w.seq_len, r)["peak"] for r in (False, True)
    }
    if w.lora is not None:
        act = {
            r: v + lora_activation_bytes(cfg, mesh, w.lora, w.micro_batch, w.seq_len, r)
            for r, v in act.items()
        }
    # LoRA: the frozen base plus adapters resident; moments and gradients of the adapters
    # alone; the reference is the base itself (adapters off), no copy.
    trained = adapter_bytes(cfg, mesh, TRAIN_RULES, w.lora)[0] if w.lora else params
    if w.lora is not None and w.lora.quantize_base == "int8":
        params -= int8_base_saving(cfg, mesh, w.lora)
    sampler = {k: side.pop(k) for k in SAMPLER_KEYS} if w.rollout_devices else {}
    terms = {
        "params": params + (trained if w.lora else 0),
        "optimizer": MOMENTS * trained,
        "grads": int(GRAD_COPIES * trained),
        "reference": params if w.reference and not w.lora else 0,
        "critic_params": critic,
        "critic_optimizer": MOMENTS * critic,
        "critic_grads": int(GRAD_COPIES * critic),
        "batch": batch_bytes(mesh, w),
        "activations": act[cfg.remat] + gathered_bytes(cfg, mesh),
        # The producer's copies of the trained params (learner/overlap.py), on their layout.
        "overlap_weights": (w.max_staleness + 1) * trained if w.max_staleness else 0,
        **{k: 0 for k in sampler},  # on the sampler's devices (`sampler_terms`)
        **side,
    }
    return Plan(
        model={
            "name": name,
            "params": count,
            "dtype": cfg.dtype,
            "param_dtype": cfg.param_dtype,
            "layers": cfg.num_layers,
        },
        mesh=dict(zip(ax.MESH_AXES, mesh_shape)),
        workload=dataclasses.asdict(w),
        terms=terms,
        activations_no_remat=act[False],
        activations_remat=act[True],
        remat=cfg.remat,
        device_memory=device_memory,
        sampler_terms=sampler,
        host_mesh=dict(zip(ax.MESH_AXES, host)) if host else None,
    )
