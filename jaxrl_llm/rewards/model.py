"""Reward models: a Hugging Face `*ForSequenceClassification` folder scoring responses on
device (`RewardModel`), named in configs as `"rm:/path/to/folder"`.

The folder (Qwen2/Qwen2.5, Qwen3 or Llama, one label, as reward models are: Skywork-Reward,
Qwen2.5-Math-RM) loads into our `ValueModel`: the shared trunk, and HF's `score.weight`
[1, D] as its head (HF's sequence classifiers have no bias; `score_bias` stays 0). A row is
scored as HF does (`transformers.modeling_layers.GenericForSequenceClassification.forward`):
the head's output at the row's last token that is not the config's `pad_token_id` (so a
response ending in the pad id, e.g. pad == eos, is read one token earlier, as HF reads it);
with no `pad_token_id`, at the last token.

The text is the RM's own: the prompt and the response as a conversation, rendered by the RM
tokenizer's chat template (the data row's `messages`, else its `prompt` as one user message,
then the response as the assistant's turn); a tokenizer without a chat template gets the
prompt (the messages' contents joined by newlines) followed directly by the response.

Batches are packed: a call's conversations are placed whole into rows of T tokens (T: the
longest conversation's length rounded up to a power of two; first-fit decreasing,
`data.packing.first_fit_rows`), told apart by segment ids (attention stays within each)
with positions restarting at 0 in each, so short responses share a row instead of padding
one each. Rows are scored `RewardModelConfig.batch_size` at a time, the row count rounded
up to a power of two, so a run compiles a handful of programs. A conversation's score is the
head's output at its own score index in its row.

Shapes: B packed rows, T tokens, D embed, S conversations.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.data.examples import row_conversation
from jaxrl_llm.data.packing import first_fit_rows
from jaxrl_llm.models.hf_files import check_checkpoint, read_config, tensor_names
from jaxrl_llm.models.hf_io import CheckpointError, from_pretrained
from jaxrl_llm.models.tokenizer import load_tokenizer
from jaxrl_llm.models.transformer import ValueModel
from jaxrl_llm.rewards.model_config import (
    NORMALIZATIONS,
    RM_PREFIX,
    WHITEN_EPS,
    RewardModelConfig,
)

log = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 16


def check_reward_model(path: str | os.PathLike, field: str = "reward") -> None:
    """Fail now unless `path` is a `*ForSequenceClassification` folder with one label, a
    `score.weight` and a tokenizer: a policy folder would otherwise load with a zero head."""
    check_checkpoint(path, field)
    hf = read_config(path)
    archs = hf.get("architectures") or ["(none)"]
    name = f"{RM_PREFIX}{path}"
    where = f"{field} {name!r}" if field.startswith("--") else f"{field} = {name!r}"
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise CheckpointError(
            f"{where}: config.json's architecture {archs[0]!r} is not a reward model; expected "
            "a *ForSequenceClassification folder (e.g. Qwen2ForSequenceClassification)"
        )
    labels = len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)
    if labels != 1:
        raise CheckpointError(
            f"{where}: the classifier has {labels} labels; a reward model has one score "
            "(num_labels = 1)"
        )
    if "score.weight" not in tensor_names(path):
        raise CheckpointError(f"{where}: no 'score.weight' tensor in the checkpoint")


def load_reward_model(
    path: str | os.PathLike, *, dtype: str = "float32", mesh: Mesh | None = None
) -> ValueModel:
    """The checked folder as a `ValueModel` (placed in the training layout over `mesh`)."""
    check_reward_model(path)
    model = from_pretrained(path, dtype=dtype, mesh=mesh, cls=ValueModel)
    assert isinstance(model, ValueModel)
    return model


def conversation(example: Mapping[str, Any], response: str) -> list[dict[str, str]]:
    """The chat an RM scores: the row's `messages` (or its `prompt`: a string as one user
    message, or a list of messages), then `response` as the assistant's turn. The rule is
    `data.examples.row_conversation`, the one `jaxrl-llm score` and `rm` check rows with."""
    try:
        chat = row_conversation(example)
    except ValueError as e:
        raise ValueError(
            "a reward model reads the row's 'messages', else its 'prompt' (a string or chat "
            f"messages): {e}"
        ) from None
    return [*chat, {"role": "assistant", "content": response}]


def conversation_tokens(tokenizer, chats: Sequence[list[dict[str, str]]]) -> list[list[int]]:
    """Each chat's token ids: the chat template's text, tokenized without adding special
    tokens (the template writes them); without a template, the prompt's contents joined by
    newlines followed by the response, with the tokenizer's own special tokens."""
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template(chat, tokenize=False) for chat in chats]
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    texts = ["\n".join(m["content"] for m in chat[:-1]) + chat[-1]["content"] for chat in chats]
    return tokenizer(texts)["input_ids"]


def score_index(ids: Sequence[int], pad_token_id: int | None) -> int:
    """Where HF reads a row's score: the last token that is not `pad_token_id` (0 when every
    token is; the last token when there is no pad id)."""
    if pad_token_id is None:
        return len(ids) - 1
    real = np.flatnonzero(np.asarray(ids) != pad_token_id)
    return int(real[-1]) if real.size else 0


def bucket(n: int, least: int = 1) -> int:
    """The power of two at or above `n` (and `least`)."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def normalize_scores(scores: np.ndarray, how: str) -> np.ndarray:
    """`scores` [B] by `how` (one of `NORMALIZATIONS`), in float32."""
    scores = np.asarray(scores, np.float64)
    if how == "whiten":
        scores = (scores - scores.mean()) / (scores.std() + WHITEN_EPS) if scores.size else scores
    elif how == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-scores))
    elif how != "raw":
        raise ValueError(f"normalize {how!r}: choose one of {NORMALIZATIONS}")
    return scores.astype(np.float32)


def packed_scores(model: ValueModel, ids, positions, segment_ids, where):
    """ids, positions, segment_ids [B, T], where [S] (flat index b * T + t) -> the head's
    float32 output at each conversation's score token [S]."""
    values = model(ids, positions=positions, segment_ids=segment_ids)
    return values.reshape(-1)[where]


class RewardModel:
    """An RM folder scoring (response, data row) pairs in the trainer's process, on device.

    `score(responses, examples)` has `RewardPool.score`'s form, so the RL stage scores with it
    unchanged; `score_tokens(rows)` scores token rows. `mesh`: the devices to place it on (the
    policy's training layout); None: the default device. Scores are float32 [B].
    """

    def __init__(
        self,
        path: str | os.PathLike,
        config: RewardModelConfig | None = None,
        *,
        mesh: Mesh | None = None,
    ):
        self.path = Path(path)
        self.name = f"{RM_PREFIX}{path}"
        self.config = config or RewardModelConfig()
        model = load_reward_model(self.path, dtype=self.config.dtype, mesh=mesh)
        self.pad_token_id = model.config.pad_token_id
        self.tokenizer = load_tokenizer(self.path)
        graphdef, self._state = nnx.split(model)
        self._forward = jax.jit(
            lambda state, ids, positions, segments, where: packed_scores(
                nnx.merge(graphdef, state), ids, positions, segments, where
            )
        )
        self.last_failures: dict = {}  # the pool's failure record: a model never times out
        self.truncated = 0  # rows cut to `max_length` so far

    def score(self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Each response's score against its data row's prompt, normalised as configured."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        chats = [conversation(e, r) for r, e in zip(responses, examples, strict=True)]
        rows = conversation_tokens(self.tokenizer, chats) if chats else []
        return normalize_scores(self.score_tokens(rows), self.config.normalize)

    def score_tokens(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Raw float32 scores [S] of token rows, packed (the module docstring)."""
        rows = [self._fit(list(r)) for r in rows]
        out = np.zeros(len(rows), np.float32)
        if not rows:
            return out
        T = min(bucket(max(map(len, rows)), MIN_LENGTH_BUCKET), bucket(self.config.max_length))
        packed = first_fit_rows([len(r) for r in rows], T)
        size = self.config.batch_size
        for start in range(0, len(packed), size):
            chunk = packed[start : start + size]
            order = [j for row in chunk for j in row]
            out[order] = self._score_packed([[rows[j] for j in row] for row in chunk], T)
        return out

    def _fit(self, row: list[int]) -> list[int]:
        if not row:
            raise ValueError("a reward model cannot score an empty row")
        limit = self.config.max_length
        if len(row) <= limit:
            return row
        self.truncated += 1
        if self.truncated == 1:
            log.warning(
                "%s: a row of %d tokens keeps its last %d (RewardModelConfig.max_length); "
                "counted in RewardModel.truncated", self.name, len(row), limit,
            )  # fmt: skip
        return row[-limit:]

    def _score_packed(self, packed: list[list[list[int]]], T: int) -> np.ndarray:
        """Scores of the conversations of `packed` (rows of conversations' tokens), in row
        order, from one forward over power-of-two many rows of T tokens."""
        B = bucket(len(packed))
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        ids = np.full((B, T), pad, np.int32)
        segments = np.zeros((B, T), np.int32)
        positions = np.zeros((B, T), np.int32)
        where: list[int] = []
        for b, conversations in enumerate(packed):
            start = 0
            for k, row in enumerate(conversations):
                end = start + len(row)
                ids[b, start:end] = row
                segments[b, start:end] = k + 1
                positions[b, start:end] = np.arange(len(row))
                where.append(b * T + start + score_index(row, self.pad_token_id))
                start = end
        S = len(where)
        at = np.zeros(bucket(S), np.int32)  # a power of two: few programs
        at[:S] = where
        scores = self._forward(
            self._state, jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(segments),
            jnp.asarray(at),
        )  # fmt: skip
        return np.asarray(scores, np.float32)[:S]

    def close(self) -> None:
        """Nothing to stop (no workers); the weights go with the object."""

    def __enter__(self) -> RewardModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = [
    "RewardModel",
    "bucket",
    "check_reward_model",
    "conversation",
    "conversation_tokens",
    "load_reward_model",
    "normalize_scores",
    "packed_scores",
    "score_index",
]
