"""The built-in retrieval task for Search-R1: facts about invented entities.

Every fact is about made-up names ("Zorvath was born in Quellin."), so no model can answer
its question without retrieving the fact's document: the task isolates the skill Search-R1
trains (search, read, answer). Three kinds of fact (``KINDS``):

- ``born``:    "{person} was born in {city}."    "Where was {person} born?"    -> city
- ``capital``: "The capital of {land} is {city}."  "What is the capital of {land}?" -> city
- ``length``:  "The {river} river is {n} km long."  "How long is the {river} river in km?" -> n

``write_task`` writes three jsonl files:

- ``corpus.jsonl``: one document per fact, ``{"id", "contents"}`` with ``contents`` =
  "{title}\\n{fact}" (Search-R1's corpus format; the title is the fact's subject). The corpus
  holds every fact, validation facts included: the corpus is the world the model searches.
- ``train.jsonl`` / ``val.jsonl``: ``{"id", "prompt", "question", "answer", "golden_answers",
  "kind", "doc_id"}``; ``prompt`` is the bare question (the ``search_r1`` prompt template adds
  Search-R1's instruction), ``answer`` the exact string that EM compares against.

The train/val partition is fixed by a hash of the question (``split_of``), as in the
arithmetic task, so every seed and size draws from the same sides. Names are unique across
the whole corpus (subjects and answers alike), built from syllables, 5-8 letters.
Generation is deterministic in the seed (Python's ``random.Random``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_llm.data.tasks.arithmetic import write_jsonl

KINDS = {
    "born": ("{s} was born in {o}.", "Where was {s} born?"),
    "capital": ("The capital of {s} is {o}.", "What is the capital of {s}?"),
    "length": ("The {s} river is {o} km long.", "How long is the {s} river in km?"),
}
HELDOUT_PERCENT = 10
SPLITS = ("train", "val")

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "qu", "kr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou")
_CODAS = ("", "", "n", "l", "r", "th", "s", "x", "v")


@dataclasses.dataclass(frozen=True)
class Fact:
    kind: str  # a key of KINDS
    subject: str  # the invented entity the fact is about (its document's title)
    answer: str

    @property
    def sentence(self) -> str:
        return KINDS[self.kind][0].format(s=self.subject, o=self.answer)

    @property
    def question(self) -> str:
        return KINDS[self.kind][1].format(s=self.subject)


def split_of(question: str) -> str:
    """ "val" for 10% of all possible questions (by a hash of the text), "train" otherwise."""
    digest = hashlib.sha256(question.encode()).digest()
    return "val" if int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT else "train"


def invent_name(rng: random.Random, taken: set[str]) -> str:
    """A new capitalised pseudo-word of 2-3 syllables and 5-8 letters (short, so a tiny model
    can copy it) not in `taken`; it is added to `taken`."""
    while True:
        syllables = rng.choice((2, 2, 3))
        name = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        ).capitalize()
        if 5 <= len(name) <= 8 and name not in taken:
            taken.add(name)
            return name


def make_fact(rng: random.Random, taken: set[str], kinds: Sequence[str] = tuple(KINDS)) -> Fact:
    kind = rng.choice(list(kinds))
    subject = invent_name(rng, taken)
    answer = str(rng.randint(100, 9999)) if kind == "length" else invent_name(rng, taken)
    return Fact(kind, subject, answer)


def generate_facts(n: int, *, seed: int = 0, kinds: Sequence[str] = tuple(KINDS)) -> list[Fact]:
    """`n` facts about distinct invented subjects, deterministic in `seed`."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown fact kind {kind!r}; kinds are {sorted(KINDS)}")
    rng, taken = random.Random(seed), set()
    return [make_fact(rng, taken, kinds) for _ in range(n)]


def question_row(fact: Fact, row_id: str, doc_id: str) -> dict[str, Any]:
    return {
        "id": row_id,
        "prompt": fact.question,
        "question": fact.question,
        "answer": fact.answer,
        "golden_answers": [fact.answer],
        "kind": fact.kind,
        "doc_id": doc_id,
    }


def build_task(
    *, n_train: int = 1000, n_val: int = 100, seed: int = 0, kinds: Sequence[str] = tuple(KINDS)
) -> dict[str, list[dict[str, Any]]]:
    """The corpus and the train/val question rows (see the module docstring).

    Facts are drawn until both splits have their counts; facts drawn beyond one split's
    count stay in the corpus as extra documents (distractors) without a question.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError("n_train and n_val must be >= 0")
    rng, taken = random.Random(seed), set()
    corpus: list[dict[str, Any]] = []
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    want = {"train": n_train, "val": n_val}
    while any(len(rows[s]) < want[s] for s in SPLITS):
        fact = make_fact(rng, taken, kinds)
        doc_id = f"doc-{len(corpus):05d}"
        corpus.append({"id": doc_id, "contents": f"{fact.subject}\n{fact.sentence}"})
        split = split_of(fact.question)
        if len(rows[split]) < want[split]:
            rows[split].append(question_row(fact, f"{split}-{len(rows[split]):05d}", doc_id))
    return {"corpus": corpus, **rows}


def write_task(
    out_dir: str | os.PathLike,
    *,
    n_train: int = 1000,
    n_val: int = 100,
    seed: int = 0,
    kinds: Sequence[str] = tuple(KINDS),
) -> dict[str, Path]:
    """Writes ``corpus.jsonl``, ``train.jsonl`` and ``val.jsonl`` into ``out_dir``.

    Returns:
      ``{"corpus": path, "train": path, "val": path}``.
    """
    task = build_task(n_train=n_train, n_val=n_val, seed=seed, kinds=kinds)
    out_dir = Path(out_dir)
    return {name: write_jsonl(task[name], out_dir / f"{name}.jsonl") for name in task}
