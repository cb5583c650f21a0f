"""The prompt pipeline: source -> examples -> template -> tokens -> Grain batches, resumable.

Built once at start-up (``build_prompt_pipeline``):

1. read and normalize every row (``examples.load_examples``): malformed rows are skipped and
   reported with their lines, or raise in strict mode;
2. render each prompt with its template and tokenize it; prompts longer than
   ``max_prompt_length`` tokens are dropped, counted and logged (``PromptPipeline.report``);
3. a Grain ``MapDataset`` over the prepared prompts: each epoch shuffled (``epoch_seed``)
   -> keep ``steps_per_epoch * global_batch_size`` of it (the remainder differs each epoch, as
   with a drop-last data loader), ``num_epochs`` times -> this host's share
   ``[process_index::process_count]`` -> ``batch``.
   Global batch ``b`` is the union over hosts of their local batch ``b``, so every host steps
   in lockstep and each epoch's batches never mix epochs.

Everything that can fail or be counted happens in steps 1-2, before the first step, so the
iterator itself only indexes in-memory data. RL prompt sets (thousands to a few million
prompts) fit comfortably; the whole source is read at start-up.

The iterator's state (``PromptIterator.get_state``) is a small JSON-serialisable dict: Grain's
``next_index`` plus a fingerprint of the data and pipeline settings, so restoring it onto
different data fails loudly instead of silently training on other prompts. The fingerprint
hashes each prepared prompt's id, token ids (its text, template and tokenizer) and answer,
in order, with the settings that order them: ids alone miss other rows under the same ids
(rows without an id are named ``<file name>:<line>``, or ``<file name>[<index>]`` for
elements of a JSON array that share a line; the file name is the path within a dataset
folder where several of its files share a base name). States saved before it covered the
content (no ``fingerprint_version``) hold a hash of the ids and settings only; they are
still accepted when that hash matches, with a warning, so older checkpoints resume; states
from before ``epoch_seed`` (no ``order_version``) only within the first epoch. Save it
with the checkpoint (Orbax: ``ocp.args.JsonSave(state)``); it is the same on every host, so
host 0's copy restores all of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np
from grain.experimental import index_shuffle

from jaxrl_llm.config_checks import ConfigError, Ge, Interval, checked_fields
from jaxrl_llm.data.epoch_order import epoch_seed
from jaxrl_llm.data.examples import DataReport, FieldMap, load_examples
from jaxrl_llm.data.sources import SourceConfig
from jaxrl_llm.data.templates import TEMPLATES, render_prompt

log = logging.getLogger(__name__)

_STATE_VERSION = 1
# 2: ids, token ids and answers (`PromptPipeline._fingerprint`); absent: ids only (before
# 2026-12-05, `PromptPipeline.ids_fingerprint`).
_FINGERPRINT_VERSION = 2
# 2: epochs >= 1 seeded by `epoch_seed`'s hash; absent: by seed + epoch (before 63937c5).
_ORDER_VERSION = 2


@dataclasses.dataclass(frozen=True)
@checked_fields(
    template=TEMPLATES,
    max_prompt_length=Ge(1),
    global_batch_size=Ge(1),
    num_epochs=Ge(1),
    seed=Interval(ge=0, lt=2**32),  # Grain's shuffle seeds
)
class PipelineConfig:
    """Settings of a prompt pipeline.

    Attributes:
      source: where the prompts are.
      fields: which keys hold the id, prompt and answer.
      template: one of ``templates.TEMPLATES`` (``raw``, ``chat``, ``torl``, ``search_r1``).
      use_chat_template: wrap the template's messages in the tokenizer's chat template.
      system_prompt: optional system message (replaces ToRL's for ``torl``).
      max_prompt_length: prompts with more tokens are dropped; batches are padded to it.
      global_batch_size: prompts per step over all hosts (each gets G samples in rollout).
      num_epochs: passes over the data; None repeats forever.
      shuffle: reshuffle every epoch (deterministically from ``seed``: ``epoch_seed``).
      seed: shuffle seed, in [0, 2**32).
      drop_remainder: drop each epoch's last partial global batch. False (evaluation) needs
        ``num_epochs=1`` and one process; the last batch is then smaller.
      strict: raise on the first malformed row instead of skipping it.
      add_special_tokens: passed to the tokenizer; None means False with a chat template (the
        template writes its own special tokens) and True otherwise.
      pad_token_id: padding id; None uses the tokenizer's pad id, else its eos id, else 0.
    """

    source: SourceConfig
    fields: FieldMap = dataclasses.field(default_factory=FieldMap)
    template: str = "raw"
    use_chat_template: bool = False
    system_prompt: str | None = None
    max_prompt_length: int = 1024
    global_batch_size: int = 8
    num_epochs: int | None = 1
    shuffle: bool = True
    seed: int = 0
    drop_remainder: bool = True
    strict: bool = False
    add_special_tokens: bool | None = None
    pad_token_id: int | None = None


@dataclasses.dataclass(frozen=True)
class PreparedPrompt:
    """One example after templating and tokenisation."""

    example: dict[str, Any]
    text: str
    input_ids: np.ndarray  # int32 [T]


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """One host's share of one step's prompts.

    Attributes:
      ids: example ids (what LIMR's sample records refer to).
      prompts: the normalized prompt text, before the template.
      answers: ground truths for the reward functions.
      texts: the rendered prompt the model is given.
      input_ids: int32 ``[B, T]`` token ids, right-padded with ``pad_token_id`` to
        ``T = max_prompt_length`` (one static shape for the whole run).
      prompt_lengths: int32 ``[B]`` true lengths (``input_ids[i, :prompt_lengths[i]]``).
      examples: the full normalized examples, passthrough fields included.
      index: 0-based global batch index since the start of training (RL step = index + 1).
      epoch: 0-based epoch this batch belongs to.
    """

    ids: list[str]
    prompts: list[str]
    answers: list[str | list[str]]
    texts: list[str]
    input_ids: np.ndarray
    prompt_lengths: np.ndarray
    examples: list[dict[str, Any]]
    index: int
    epoch: int

    def __len__(self) -> int:
        return len(self.ids)


def prepare_prompts(
    examples: Sequence[dict[str, Any]], config: PipelineConfig, tokenizer: Any, report: DataReport
) -> list[PreparedPrompt]:
    """Renders and tokenizes ``examples``; drops (and records in ``report``) the too-long ones."""
    if config.template not in TEMPLATES:
        raise ValueError(f"unknown template {config.template!r}; expected one of {TEMPLATES}")
    chat = config.use_chat_template or config.template == "chat"
    texts = [
        render_prompt(
            ex,
            config.template,
            tokenizer=tokenizer,
            use_chat_template=chat,
            system_prompt=config.system_prompt,
        )
        for ex in examples
    ]
    special = (not chat) if config.add_special_tokens is None else config.add_special_tokens
    token_lists = tokenizer(texts, add_special_tokens=special)["input_ids"] if texts else []
    prepared = []
    for example, text, ids in zip(examples, texts, token_lists, strict=True):
        if len(ids) > config.max_prompt_length:
            report.too_long.append(example["id"])
            continue
        prepared.append(PreparedPrompt(example, text, np.asarray(ids, dtype=np.int32)))
    report.kept = len(prepared)
    if report.too_long:
        shown = ", ".join(report.too_long[:10]) + (" ..." if len(report.too_long) > 10 else "")
        log.warning(
            "filtered %d of %d prompts longer than %d tokens: %s",
            len(report.too_long),
            len(examples),
            config.max_prompt_length,
            shown,
        )
    return prepared


def _too_few_prompts(n: int, config: PipelineConfig, report: DataReport) -> str:
    """Why a source gives no full batch, and the setting to change."""
    message = (
        f"{config.source.path}: {n} usable prompts is fewer than one global batch "
        f"({config.global_batch_size})"
    )
    if report.too_long:
        return message + (
            f": {len(report.too_long)} prompts are longer than {config.max_prompt_length} "
            "tokens; raise the maximum prompt length (DataConfig.max_prompt_length, eval's "
            "--max-prompt-length)"
        )
    return message + ": give more prompts, or fewer per step (DataConfig.prompts_per_step)"


def _pad_id(config: PipelineConfig, tokenizer: Any) -> int:
    for candidate in (
        config.pad_token_id,
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if candidate is not None:
            return int(candidate)
    return 0


class PromptPipeline:
    """Prepared prompts and the Grain dataset of this host's batches.

    Attributes:
      config: the settings it was built with.
      prompts: the prepared prompts in source order (after filtering).
      report: rows read, malformed rows, prompts filtered as too long.
      local_batch_size: prompts per batch on this host.
      steps_per_epoch: global batches per epoch.
      dataset: the ``grain.MapDataset`` of ``PromptBatch`` for this host.
    """

    def __init__(
        self,
        config: PipelineConfig,
        tokenizer: Any,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} not in [0, {process_count})")
        if config.global_batch_size % process_count:
            raise ConfigError(
                f"DataConfig.prompts_per_step = {config.global_batch_size} is not divisible by "
                f"the {process_count} hosts (processes): each takes an equal share of a step's "
                f"prompts; use a multiple of {process_count}"
            )
        if not config.drop_remainder and (config.num_epochs != 1 or process_count != 1):
            raise ValueError("drop_remainder=False needs num_epochs=1 and a single process")
        self.config = config
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch_size = config.global_batch_size // process_count
        self.pad_token_id = _pad_id(config, tokenizer)

        examples, self.report = load_examples(config.source, config.fields, strict=config.strict)
        self.prompts = prepare_prompts(examples, config, tokenizer, self.report)
        log.info("prompt data %s: %s", config.source.path, self.report.summary())

        n = len(self.prompts)
        if config.drop_remainder:
            self.steps_per_epoch = n // config.global_batch_size
            per_epoch = self.steps_per_epoch * config.global_batch_size
        else:
            self.steps_per_epoch = -(-n // config.global_batch_size)
            per_epoch = n
        if self.steps_per_epoch == 0:
            raise ConfigError(_too_few_prompts(n, config, self.report))
        self.fingerprint = self._fingerprint()

        self._per_epoch = per_epoch
        ds = grain.MapDataset.range(per_epoch).repeat(config.num_epochs)
        ds = ds.map_with_index(self._prompt_at)
        if process_count > 1:
            ds = ds[process_index::process_count]
        ds = ds.batch(self.local_batch_size, drop_remainder=config.drop_remainder, batch_fn=list)
        self.dataset = ds.map_with_index(self._make_batch)

    def _prompt_at(self, index: int, position: int) -> PreparedPrompt:
        """The prompt at global position ``index``, ``position`` in its epoch: the permutation
        of all prompts that ``MapDataset.shuffle`` draws, seeded by ``epoch_seed``."""
        if self.config.shuffle:
            seed = epoch_seed(self.config.seed, index // self._per_epoch)
            n = len(self.prompts)
            position = index_shuffle(position, max_index=n - 1, seed=seed, rounds=4)
        return self.prompts[position]

    def _settings(self) -> list[Any]:
        c = self.config
        return [
            c.shuffle, c.seed, c.global_batch_size, c.num_epochs, c.drop_remainder,
            self.process_count,
        ]  # fmt: skip

    def _fingerprint(self) -> str:
        """The settings, then each prepared prompt's id and answer (JSON) and its token ids
        (int32 bytes, after their count: no two prompts' fields run into each other)."""
        h = hashlib.sha256(json.dumps(self._settings()).encode())
        for p in self.prompts:
            h.update(json.dumps([p.example["id"], p.example["answer"]], default=str).encode())
            tokens = np.asarray(p.input_ids, np.int32)
            h.update(len(tokens).to_bytes(8, "little") + tokens.tobytes())
        return h.hexdigest()[:16]

    def ids_fingerprint(self) -> str:
        """The fingerprint of states saved before it covered the content: ids and settings."""
        key = {"ids": [p.example["id"] for p in self.prompts], "settings": self._settings()}
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def _make_batch(self, index: int, prompts: list[PreparedPrompt]) -> PromptBatch:
        length = self.config.max_prompt_length
        input_ids = np.full((len(prompts), length), self.pad_token_id, dtype=np.int32)
        lengths = np.zeros((len(prompts),), dtype=np.int32)
        for row, prompt in enumerate(prompts):
            input_ids[row, : len(prompt.input_ids)] = prompt.input_ids
            lengths[row] = len(prompt.input_ids)
        return PromptBatch(
            ids=[p.example["id"] for p in prompts],
            prompts=[p.example["prompt"] for p in prompts],
            answers=[p.example["answer"] for p in prompts],
            texts=[p.text for p in prompts],
            input_ids=input_ids,
            prompt_lengths=lengths,
            examples=[p.example for p in prompts],
            index=index,
            epoch=index // self.steps_per_epoch,
        )

    @property
    def num_batches(self) -> int | None:
        """Batches in the whole run, or None when repeating forever."""
        return None if self.config.num_epochs is None else len(self.dataset)

    def iterator(self, state: dict[str, Any] | None = None) -> PromptIterator:
        """A fresh iterator over this host's batches, optionally restored from ``state``."""
        it = PromptIterator(self)
        if state is not None:
            it.set_state(state)
        return it


class PromptIterator:
    """Iterates ``PromptBatch``es; ``get_state``/``set_state`` resume exactly mid-epoch."""

    def __init__(self, pipeline: PromptPipeline):
        self._pipeline = pipeline
        read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        self._it = pipeline.dataset.to_iter_dataset(read_options).__iter__()

    def __iter__(self) -> PromptIterator:
        return self

    def __next__(self) -> PromptBatch:
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable dict: Grain's iterator state plus the data fingerprint."""
        return {
            "version": _STATE_VERSION,
            "fingerprint": self._pipeline.fingerprint,
            "fingerprint_version": _FINGERPRINT_VERSION,
            "order_version": _ORDER_VERSION,
            "grain": self._it.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state``; raises ``ValueError`` if it belongs to other data/settings.
        A state without ``fingerprint_version`` (saved before the fingerprint covered the
        prompts' content) is checked against the ids and settings only, with a warning; one
        without ``order_version`` (epochs >= 1 seeded by seed + epoch) is refused past epoch 0."""
        kind = state.get("fingerprint_version")
        if state.get("version") != _STATE_VERSION or "grain" not in state or kind not in (
            None, _FINGERPRINT_VERSION,
        ):  # fmt: skip
            raise ValueError(f"not a prompt iterator state: {state!r:.200}")
        want = self._pipeline.fingerprint if kind else self._pipeline.ids_fingerprint()
        if state.get("fingerprint") != want:
            raise ValueError(
                "the data iterator state was saved for different prompts or pipeline settings "
                f"(fingerprint {state.get('fingerprint')} != {want})"
            )
        if kind is None:
            log.warning(
                "the data iterator state predates content fingerprints: only the prompt ids "
                "and pipeline settings were checked, not the prompts' text or answers"
            )
        pipe, done = self._pipeline, state["grain"].get("next_index", 0)
        old_order = state.get("order_version") != _ORDER_VERSION and pipe.config.shuffle
        if old_order and done > pipe.steps_per_epoch:  # its later epochs: other prompts
            raise ValueError(
                f"the data iterator state was saved {done} batches in, past the first epoch "
                f"({pipe.steps_per_epoch} batches), by a version that shuffled later epochs "
                "with seed + epoch; they are now shuffled with a hash of (seed, epoch), so the "
                "run would go on with other prompts: finish it with that version, or start anew"
            )
        self._it.set_state(state["grain"])


def build_prompt_pipeline(
    config: PipelineConfig,
    tokenizer: Any,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> PromptPipeline:
    """Builds the prompt pipeline for this host (pass ``jax.process_index()``/``count()``)."""
    return PromptPipeline(
        config, tokenizer, process_index=process_index, process_count=process_count
    )
