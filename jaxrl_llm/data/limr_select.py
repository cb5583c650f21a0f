"""LIMR's subsets: the prompts a LIM score keeps (``select``) and the RAND baseline of the
same size (``random_subset``), written in the training data's own format, jsonl, json or
parquet (other data, arrow included, is refused with ``ConfigError``: convert it first) (step 3
of the workflow in ``jaxrl_llm.data.limr``). An empty subset is never written: both raise
``ConfigError`` saying why it would be empty (a threshold above every score, scored ids that
are not the data's, a size the data cannot give)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import numpy as np
from etils import epath

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.examples import DEFAULT_FIELDS, DataReport, FieldMap, iter_examples
from jaxrl_llm.data.limr import LimScores, load_scores, write_atomic
from jaxrl_llm.data.sources import SourceConfig, detect_format, read_records

log = logging.getLogger(__name__)


def _read_data(data_path: str | os.PathLike, fields: FieldMap, data_format: str):
    source = SourceConfig(str(data_path), format=data_format)
    fmt = detect_format(source)
    if fmt not in ("jsonl", "json", "parquet"):
        raise ConfigError(
            f"{data_path} is {fmt} data; selection writes jsonl, json or parquet: convert "
            f"{data_path} to one of them"
        )
    report = DataReport()
    return fmt, list(iter_examples(read_records(source), fields, report))


def check_out_path(data_path: str | os.PathLike, out_path: str | os.PathLike) -> None:
    """``ConfigError`` for an ``out_path`` a subset cannot be written to: the data file itself
    (the selection would replace the training data) or a folder."""
    out, data = epath.Path(out_path), epath.Path(data_path)
    if out.is_dir():
        raise ConfigError(f"--out {out_path} is a folder: give a file path for the subset")
    local = "://" not in os.fspath(out_path) and "://" not in os.fspath(data_path)
    same = os.path.realpath(out_path) == os.path.realpath(data_path) if local else out == data
    if same:
        raise ConfigError(
            f"--out {out_path} is the --data file: writing the subset there would replace the "
            "training data; give another path"
        )


def write_subset(
    data_path: str | os.PathLike,
    keep_ids: set[str] | Sequence[str],
    out_path: str | os.PathLike,
    *,
    fields: FieldMap = DEFAULT_FIELDS,
    data_format: str = "auto",
) -> int:
    """Writes the rows of ``data_path`` whose id is in ``keep_ids``, in the same format.

    jsonl lines are copied byte for byte; a json array stays a json array of the original
    objects; parquet keeps its schema. Row order is the file's. Returns the rows written.
    """
    check_out_path(data_path, out_path)
    keep = set(keep_ids)
    fmt, records = _read_data(data_path, fields, data_format)
    chosen = [(record, ex) for record, ex in records if ex["id"] in keep]
    out_path = epath.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        write_atomic(out_path, "".join(record.text + "\n" for record, _ in chosen))
    elif fmt == "json":
        rows = [record.row for record, _ in chosen]
        write_atomic(out_path, json.dumps(rows, indent=4, ensure_ascii=False) + "\n")
    else:
        import pyarrow.parquet as pq

        with epath.Path(data_path).open("rb") as f:
            table = pq.read_table(f).take([record.line - 1 for record, _ in chosen])
        with out_path.open("wb") as f:
            pq.write_table(table, f)
    return len(chosen)


def kept_ids(scores: LimScores | str | os.PathLike, threshold: float) -> set[str]:
    """The prompt ids a LIM subset keeps: score >= ``threshold`` (a ``LimScores`` or the path
    of a scores file from ``score_run``)."""
    if not isinstance(scores, LimScores):
        scores = load_scores(scores)
    return {pid for pid, s in zip(scores.ids, scores.scores, strict=True) if s >= threshold}


def lim_subset_size(
    scores: LimScores | str | os.PathLike,
    data_path: str | os.PathLike,
    threshold: float,
    *,
    fields: FieldMap = DEFAULT_FIELDS,
    data_format: str = "auto",
) -> int:
    """How many prompts ``select`` would write, without writing them: the kept ids that are
    in ``data_path`` (the size of LIMR's RAND baseline). ``ConfigError`` when there are none
    (``select`` would refuse)."""
    if not isinstance(scores, LimScores):
        scores = load_scores(scores)
    keep = kept_ids(scores, threshold)
    _, records = _read_data(data_path, fields, data_format)
    n = len(keep & {ex["id"] for _, ex in records})
    if n == 0:
        _refuse_empty(scores, keep, threshold, data_path)
    return n


def _refuse_empty(scores: LimScores, keep: set[str], threshold: float, data_path) -> None:
    """The ``ConfigError`` of an empty LIM subset, saying which of its causes it is."""
    if not scores.ids:
        raise ConfigError("the scores file holds no scored prompt; score the run again")
    if not keep:
        raise ConfigError(
            f"no prompt has LIM score >= {threshold:g} (the highest of the {len(scores.ids)} "
            f"scored is {scores.scores.max():.4g}): lower --threshold"
        )
    raise ConfigError(
        f"none of the {len(keep)} prompts with LIM score >= {threshold:g} is in {data_path} "
        f"(e.g. id {min(keep)!r}): give the data the run trained on, and its id field if it "
        "is not 'id' (--id-key)"
    )


def select(
    scores: LimScores | str | os.PathLike,
    data_path: str | os.PathLike,
    threshold: float,
    out_path: str | os.PathLike,
    *,
    fields: FieldMap = DEFAULT_FIELDS,
    data_format: str = "auto",
) -> int:
    """Writes the LIM subset: the prompts of ``data_path`` with score >= ``threshold``.

    Args:
      scores: a ``LimScores`` or the path of a scores file from ``score_run``.
      data_path: the training data the run used (jsonl, LIMR-style json array, or parquet).
      threshold: keep scores >= threshold (inclusive; LIMR used 0.2 in its script, the issue's
        example 0.6).
      out_path: where to write the subset, in ``data_path``'s format.
      fields: the field mapping the run used (ids must match the recorded prompt ids).
      data_format: ``data_path``'s format, or ``"auto"``.

    Returns:
      the number of prompts written.

    Raises:
      ConfigError: the subset would be empty (nothing is written).
    """
    if not isinstance(scores, LimScores):
        scores = load_scores(scores)
    keep = kept_ids(scores, threshold)
    lim_subset_size(scores, data_path, threshold, fields=fields, data_format=data_format)
    n = write_subset(data_path, keep, out_path, fields=fields, data_format=data_format)
    if n < len(keep):
        log.warning("%d selected ids are not in %s", len(keep) - n, data_path)
    log.info("selected %d prompts with LIM score >= %g -> %s", n, threshold, out_path)
    return n


def random_ids(ids: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` ids drawn uniformly without replacement, deterministically from ``seed``."""
    if not 0 <= n <= len(ids):
        raise ConfigError(f"cannot draw {n} of {len(ids)} prompts")
    picks = np.random.default_rng(seed).choice(len(ids), size=n, replace=False)
    return [ids[i] for i in sorted(picks)]


def random_subset(
    data_path: str | os.PathLike,
    n: int,
    seed: int,
    out_path: str | os.PathLike,
    *,
    fields: FieldMap = DEFAULT_FIELDS,
    data_format: str = "auto",
) -> int:
    """Writes LIMR's RAND baseline: ``n`` prompts of ``data_path`` chosen at random by ``seed``.

    Use the LIM subset's size for ``n``. Same inputs give the same subset. Returns ``n``;
    ``ConfigError`` (nothing written) unless 1 <= ``n`` <= the data's usable prompts.
    """
    _, records = _read_data(data_path, fields, data_format)
    if not 1 <= n <= len(records):
        raise ConfigError(
            f"a random subset of {n} prompts from {data_path}, which has {len(records)} usable "
            f"prompts: ask for 1 to {len(records)}"
        )
    chosen = random_ids([ex["id"] for _, ex in records], n, seed)
    return write_subset(data_path, chosen, out_path, fields=fields, data_format=data_format)
