"""An RL run's prompts: train and validation pipelines from `DataConfig` (files, or the
built-in arithmetic / retrieval task written into the run directory first)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax

from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.data.examples import FieldMap
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig, require_source
from jaxrl_llm.data.tasks import SEARCH_CORPUS, builtin_task
from jaxrl_llm.data.templates import check_chat_template

log = logging.getLogger(__name__)

VAL_BATCH = 64  # validation prompts per rollout call


@dataclasses.dataclass
class PromptData:
    train: Any  # PromptPipeline
    val: Any  # PromptPipeline
    corpus: Path | None = None  # the built-in retrieval task's corpus


def check_data_files(d: DataConfig) -> None:
    """Raise `DataSourceError` (a `ConfigError`) naming the field when `train_file` or
    `val_file` is set to a path that does not exist: a run checks this before loading a model."""
    for field, path in (("train_file", d.train_file), ("val_file", d.val_file)):
        if path is not None:
            require_source(path, f"DataConfig.{field}")


def check_template(d: DataConfig, tokenizer: Any) -> None:
    """Raise `ConfigError` naming `DataConfig.template` and the checkpoint when 'chat' asks
    for a chat template the tokenizer lacks (a base model's)."""
    if d.template == "chat":
        check_chat_template(tokenizer, f"DataConfig.template = {d.template!r}")


def prompt_data(d: DataConfig, tokenizer: Any, run_dir: Path) -> PromptData:
    """Train and validation pipelines; the built-in task is written to run_dir/data first.
    Validation prompts are scored in batches of `VAL_BATCH` (the last one smaller); with
    neither a `val_file` nor built-in ones (`val_size = 0`) there are none (`PromptData.val`
    is None: validation is skipped)."""
    check_data_files(d)
    check_template(d, tokenizer)
    train_file, val_file, corpus = d.train_file, d.val_file, None
    if train_file is None:
        task = builtin_task(d.builtin_task)
        paths = task.write(
            run_dir / "data",
            n_train=d.builtin_train_size,
            n_val=d.val_size,
            seed=d.seed,
            levels=d.builtin_levels,
        )
        train_file = str(paths["train"])
        val_file = str(paths["val"]) if d.val_size else None
        corpus_key = task.supplies.get(SEARCH_CORPUS)  # the retrieval task's corpus
        corpus = paths[corpus_key] if corpus_key else None
    fields = FieldMap(
        prompt=(d.prompt_key,) if d.prompt_key else FieldMap().prompt,
        answer=(d.answer_key,) if d.answer_key else FieldMap().answer,
    )
    common: dict[str, Any] = dict(
        fields=fields,
        template=d.template,
        system_prompt=d.system_prompt,
        max_prompt_length=d.max_prompt_length,
        seed=d.seed,
    )
    proc = dict(process_index=jax.process_index(), process_count=jax.process_count())
    train = build_prompt_pipeline(
        PipelineConfig(
            source=SourceConfig(train_file),
            global_batch_size=d.prompts_per_step,
            num_epochs=None,
            **common,
        ),
        tokenizer,
        **proc,
    )
    val = None
    if val_file is not None:
        val = build_prompt_pipeline(
            PipelineConfig(
                source=SourceConfig(val_file),
                global_batch_size=VAL_BATCH,
                num_epochs=1,
                shuffle=False,
                drop_remainder=False,
                **common,
            ),
            tokenizer,
        )
    for name, pipe in (("train", train), ("val", val)):
        if pipe is not None:
            log.info("%s prompts: %s", name, pipe.report.summary())
    if val is None:
        log.info(
            "no validation prompts (DataConfig.val_file, or val_size > 0 for the built-in "
            "task): validation is skipped"
        )
    return PromptData(train, val, corpus)
