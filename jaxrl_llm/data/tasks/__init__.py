"""Built-in tasks with exact, automatically checkable answers (see ``arithmetic``), and the
table a config picks one from by name (``DataConfig.builtin_task``: ``BUILTIN_TASKS``).

What a task's files supply to the rest of the run (the retrieval task writes the corpus its
search tool reads) is declared in its entry, so config checks and the prompt data ask the
table rather than comparing task names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from jaxrl_llm.data.tasks import arithmetic, retrieval

# The search tool's corpus setting (`tools.factory.CORPUS`; data sits below tools).
SEARCH_CORPUS = "SearchConfig.corpus"


@dataclasses.dataclass(frozen=True)
class BuiltinTask:
    """A built-in task: how to write its files and what they supply.

    ``write(out_dir, *, n_train, n_val, seed, levels) -> {"train": path, "val": path, ...}``;
    ``levels`` are ``DataConfig.builtin_levels`` (arithmetic difficulty; other tasks ignore
    them). ``supplies`` maps the tool settings the written files stand in for, by their gin
    names (``tools.factory.BuiltinTool.requires``), to the key of the file in what ``write``
    returns (the retrieval task: ``SearchConfig.corpus`` -> ``"corpus"``).
    """

    write: Callable[..., dict[str, Path]]
    supplies: dict[str, str] = dataclasses.field(default_factory=dict)


def _write_arithmetic(
    out_dir: str | os.PathLike, *, n_train: int, n_val: int, seed: int, levels: Sequence[int]
) -> dict[str, Path]:
    return arithmetic.write_splits(out_dir, n_train=n_train, n_val=n_val, seed=seed, levels=levels)


def _write_retrieval(
    out_dir: str | os.PathLike, *, n_train: int, n_val: int, seed: int, levels: Sequence[int]
) -> dict[str, Path]:
    del levels  # one difficulty: every question is one lookup
    return retrieval.write_task(out_dir, n_train=n_train, n_val=n_val, seed=seed)


BUILTIN_TASKS: dict[str, BuiltinTask] = {
    "arithmetic": BuiltinTask(_write_arithmetic),
    "retrieval": BuiltinTask(_write_retrieval, supplies={SEARCH_CORPUS: "corpus"}),
}


def builtin_task(name: str) -> BuiltinTask:
    """The entry for ``name``; a ValueError lists the built-in tasks if there is none."""
    if name not in BUILTIN_TASKS:
        raise ValueError(
            f"data.builtin_task {name!r} is not a built-in task; choose one of: "
            f"{', '.join(BUILTIN_TASKS)}"
        )
    return BUILTIN_TASKS[name]
