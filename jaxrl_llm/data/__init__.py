"""Prompt data: sources, field mapping, templates, Grain pipelines, built-in tasks, LIMR.

Modules:
  sources    jsonl / json array / parquet / arrow / HF-format folders / TFDS readers
  examples   field mapping to normalized examples; malformed-row accounting
  templates  raw, chat, ToRL and Search-R1 prompt templates
  pipeline   ``build_prompt_pipeline``: tokenized, filtered, sharded, resumable batches
  limr       LIM scores, sample records, scoring a run, LIM / RAND subsets
  limr_plot  the LIMR figure (imports matplotlib)
  tasks      built-in tasks (``tasks.arithmetic``)

Names are imported on first use, so ``import jaxrl_llm.data`` stays light (Grain pulls in JAX;
TensorFlow Datasets is only imported when a TFDS source is read).
"""

import importlib
from typing import Any

_EXPORTS = {
    "SourceConfig": "sources",
    "FieldMap": "examples",
    "DataReport": "examples",
    "MalformedRowError": "examples",
    "load_examples": "examples",
    "render_prompt": "templates",
    "TEMPLATES": "templates",
    "PipelineConfig": "pipeline",
    "PromptBatch": "pipeline",
    "PromptIterator": "pipeline",
    "PromptPipeline": "pipeline",
    "build_prompt_pipeline": "pipeline",
    "lim_scores": "limr",
    "record_samples": "limr",
    "score_run": "limr",
    "select": "limr",
    "random_subset": "limr",
    "plot_lim_curves": "limr_plot",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
