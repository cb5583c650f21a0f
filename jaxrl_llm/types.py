"""Records passed between the stages of an RL step; no stage mutates another's record.

    rollout stage  -> `Rollout`     (`Completion`s, scores, in global-batch order)
    experience     -> `Experience`  (the rollout + packed rows + `TrainBatch` + summaries)
    update         <- `TrainBatch`  (as [M, mb, T] micro-batches)

Shape legend: B batch (prompts x G, groups consecutive), P prompts, G samples per prompt,
T tokens of a packed sequence (prompt then response, right-padded), M micro-batches.

Token alignment: index t of every per-token array refers to the token `input_ids[:, t]`
as an *action*: its log-probability comes from the logits at t - 1 and its value from the
hidden state at t - 1 (as in verl, where values are read one position before each response
token). Index 0 is never an action.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Generic

import jax
import numpy as np
from jax.core import Tracer
from jaxtyping import Bool, Float, Int
from typing_extensions import TypeVar  # `default=` (PEP 696) before Python 3.13

# The leaves of a pytree record (`TrainBatch`, `learner.state.TrainState`): `jax.Array` on
# the mesh (the default), `np.ndarray` on the host (`Experience.batch`), `jax.ShapeDtypeStruct`
# when only shapes and shardings are wanted (`learner.plan`).
Leaf = TypeVar("Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainBatch(Generic[Leaf]):
    """Everything an update step reads: arrays [B, T], or [M, mb, T] as micro-batches.

    Built by keyword only: seven fields are float32 arrays of one shape, so a positional
    swap would pass every other check. Each array's dtype and shape are checked when the
    record is built from arrays (`check_train_batch`); JAX also rebuilds it from tracers,
    abstract values or shardings, which pass unchecked.
    """

    input_ids: Leaf  # int32: prompt + response + padding
    loss_mask: Leaf  # float32: 1 on trained tokens: model-written (+ tool output if unmasked)
    old_logprobs: Leaf  # float32: trainer's logprobs before the update
    ref_logprobs: Leaf  # float32: frozen reference model (zeros when unused)
    advantages: Leaf  # float32
    returns: Leaf  # float32 (critic targets; advantages for critic-free estimators)
    old_values: Leaf  # float32 (zeros without a critic)
    rollout_logprobs: Leaf  # float32: the engine's logprobs (mismatch / TIS)

    def __post_init__(self) -> None:
        check_train_batch(self)


def check_train_batch(batch: TrainBatch[Any]) -> None:
    """`input_ids` int32, every other field float32 (float64 in a reference run under JAX's
    64-bit mode: all of them), all of `input_ids`' shape (rank >= 2). Leaves that are not
    concrete arrays or `jax.ShapeDtypeStruct`s are skipped."""
    shape: tuple[int, ...] | None = None
    x64 = jax.dtypes.canonicalize_dtype(np.float64) == np.float64
    wide = x64 and getattr(batch.loss_mask, "dtype", None) == np.float64
    for field in dataclasses.fields(batch):
        x = getattr(batch, field.name)
        if isinstance(x, Tracer) or not isinstance(
            x, np.ndarray | jax.Array | jax.ShapeDtypeStruct
        ):
            continue
        want = np.dtype(
            np.int32 if field.name == "input_ids" else np.float64 if wide else np.float32
        )
        shape = tuple(x.shape) if shape is None else shape
        if x.dtype != want or len(x.shape) < 2 or tuple(x.shape) != shape:
            raise ValueError(
                f"TrainBatch.{field.name} is {x.dtype}{list(x.shape)}; expected {want} of "
                f"the shape {list(shape)} [B, T] or [M, mb, T] (input_ids int32, every "
                "other field float32; pass the fields by name)"
            )


FINISH_REASONS = ("eos", "stop", "length", "prompt_too_long")


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sample as the rollout driver finished it (`rollout.completions.LiveSample`).
    Its arrays are [response] over the sample's response tokens, the model's and those
    inserted by tools (a length of its own), but `prompt_ids`: its prompt's tokens."""

    prompt_index: int
    sample_index: int
    prompt_ids: Int[np.ndarray, " prompt"]
    token_ids: Int[np.ndarray, " response"]  # int32
    # float32, under the sampled distribution; 0 on inserted tokens
    logprobs: Float[np.ndarray, " response"]
    # float32, log_softmax of raw logits; 0 on inserted tokens; None unless the request
    # asked (`SamplingParams.raw_logprobs`)
    raw_logprobs: Float[np.ndarray, " response"] | None
    response_mask: Int[np.ndarray, " response"]  # int32: 1 = model token, 0 = tool output
    finish_reason: str  # one of FINISH_REASONS
    text: str
    stop_string: str | None = None
    tool_calls: int = 0
    error: str | None = None
    # The rewards an environment gave the sample's model turns, in order, to be placed on
    # each turn's last token (`EpisodeConfig.reward_placement = "turns"`); empty: the
    # sample's score is one outcome reward, on its last trained token.
    turn_rewards: tuple[float, ...] = ()
    # int32, the policy version that sampled each token (a tool's tokens: the one current
    # when they were inserted), set when the weights may change mid-sample (partial rollouts:
    # `RLConfig.partial_rollouts`); None: every token is the batch's `Rollout.policy_version`.
    token_versions: Int[np.ndarray, " response"] | None = None


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One step's scored samples in global-batch order: sample b belongs to prompt b // G.

    Each `Completion` carries the sample's token ids, its response mask (0 on tool output:
    not the model's, never trained), the engine's logprobs, finish reason, stop string and
    tool-call count.
    """

    completions: tuple[Completion, ...]  # [B]
    answers: tuple[Any, ...]  # [B] the ground truth of each sample's prompt
    prompt_ids: tuple[Any, ...]  # [P]
    scores: Float[np.ndarray, " B"]
    group_size: int  # G
    # The step whose synchronous weights sampled these (the weights after policy_version - 1
    # updates); the step that trains on them minus this is their staleness. With partial
    # rollouts, the version sampling began with (newer tokens: `Completion.token_versions`).
    policy_version: int

    def __post_init__(self):
        B, P, G = len(self.completions), len(self.prompt_ids), self.group_size
        if B != P * G or len(self.answers) != B or self.scores.shape != (B,):
            raise ValueError(
                f"rollout of {B} samples, {P} prompts x G={G}, "
                f"{len(self.answers)} answers, scores {self.scores.shape}"
            )

    @property
    def num_tokens(self) -> int:
        """Prompt plus response tokens of every sample."""
        return sum(len(c.prompt_ids) + len(c.token_ids) for c in self.completions)

    def select_groups(self, keep: Bool[np.ndarray, " P"]) -> Rollout:
        """The groups (prompts with all their samples) where `keep` is True."""
        rows = np.repeat(keep, self.group_size)
        pick = lambda xs, mask: tuple(x for x, k in zip(xs, mask) if k)
        return dataclasses.replace(
            self,
            completions=pick(self.completions, rows),
            answers=pick(self.answers, rows),
            prompt_ids=pick(self.prompt_ids, keep),
            scores=self.scores[rows],
        )

    @classmethod
    def concat(cls, parts: Sequence[Rollout], prompts: int) -> Rollout:
        """The first `prompts` groups of `parts`, in order (same G and policy version)."""
        G, B = parts[0].group_size, prompts * parts[0].group_size
        return cls(
            completions=tuple(c for p in parts for c in p.completions)[:B],
            answers=tuple(a for p in parts for a in p.answers)[:B],
            prompt_ids=tuple(i for p in parts for i in p.prompt_ids)[:prompts],
            scores=np.concatenate([p.scores for p in parts])[:B],
            group_size=G,
            policy_version=parts[0].policy_version,
        )


@dataclasses.dataclass(frozen=True)
class Experience:
    """What the experience stage adds to a `Rollout`: the packed rows and everything the
    update reads (`batch`, on the mesh for the whole step), plus per-sample summaries."""

    rollout: Rollout
    batch: TrainBatch  # arrays [B, T] on the mesh
    model_mask: Float[np.ndarray, "B T"]  # 1 on model-written tokens (before any filter)
    response_length: Int[np.ndarray, " B"]  # all response tokens, tool output included
    length: Int[np.ndarray, " B"]  # prompt + response tokens (what packing places)
    truncated: Bool[np.ndarray, " B"]  # the sample hit its token budget
    sequence_rewards: Float[jax.Array, " B"]  # per-token rewards summed (score - KL shaping)
    has_values: bool  # a critic produced `batch.old_values`
