"""The Search-R1 search tool: BM25 over a local jsonl corpus, shown as an <information> block.

Search-R1 (Jin et al. 2025, arXiv:2503.09516; code at PeterGriffinJin/Search-R1) lets the
policy write `<search> query </search>`; generation stops there, the retriever's top-k
passages are appended as

    "\\n\\n<information>Doc 1(Title: {title}) {text}\\nDoc 2(Title: ...) ...</information>\\n\\n"

(masked out of the loss), and generation continues until `<answer> ... </answer>`. This
module follows `search_r1/llm_agent/generation.py` there: `_passages2string` for the
passages (a document's title is the first line of its `contents`, the text the rest), the
`.strip()` of the joined passages, and the "My previous action is invalid ..." observation
when the turn holds no `<search>` query. The rollout driver's `max_tool_turns` is Search-R1's
`max_turns`.

Corpus: jsonl, one document a line, either `{"id", "contents"}` (Search-R1's wiki-18 corpus,
title on the first line of `contents`) or `{"id", "title", "text"}` (DPR style; `contents`
becomes "title\\ntext"). Retrieval is `bm25s` (Lucene's BM25 variant) with pyserini's default
k1 = 0.9, b = 0.4, which Search-R1's BM25 server uses; tokens are lowercased words of two or
more characters, English stopwords removed, no stemming (pyserini stems with Porter, so
rankings on a real corpus differ slightly). Only documents sharing a term with the query are
returned (as Lucene does), so a query with no known word retrieves nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import gin

from jaxrl_llm.config_checks import Ge, checked_fields, documented
from jaxrl_llm.tools.special_tokens import neutralise_special_tokens

SEARCH_START, SEARCH_END = "<search>", "</search>"
ANSWER_END = "</answer>"
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(k=Ge(1))
class SearchConfig:
    """The built-in search tool (`RolloutConfig.tool = "search"`): its corpus and how many
    passages a query returns."""

    corpus: str | None = documented(
        None,
        "A jsonl corpus (`{id, contents}` or `{id, title, text}` rows); None only with the "
        "built-in retrieval task, which writes its own.",
    )
    k: int = documented(3, "Passages returned per query (Search-R1's topk).")


@dataclasses.dataclass(frozen=True)
class Document:
    """One corpus passage; `contents` is "title\\ntext", as in Search-R1's corpus."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        return self.contents.split("\n")[0]

    @property
    def text(self) -> str:
        return "\n".join(self.contents.split("\n")[1:])


def _document(row: object, where: str) -> Document:
    if not isinstance(row, dict) or "id" not in row:
        raise ValueError(f"{where}: a corpus row needs an 'id' field")
    if isinstance(row.get("contents"), str):
        return Document(str(row["id"]), row["contents"])
    if isinstance(row.get("title"), str) and isinstance(row.get("text"), str):
        return Document(str(row["id"]), f"{row['title']}\n{row['text']}")
    raise ValueError(f"{where}: a corpus row needs 'contents', or 'title' and 'text' strings")


def load_corpus(path: str | os.PathLike) -> list[Document]:
    """The documents of a jsonl corpus, in file order; blank lines are skipped.

    A malformed row raises ValueError with its line number: a corpus is part of the
    configuration, so it fails before training starts rather than being silently thinned.
    """
    docs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e})") from None
            docs.append(_document(row, f"{path}:{number}"))
    if not docs:
        raise ValueError(f"corpus {path} has no documents")
    return docs


class BM25Retriever:
    """BM25 (`bm25s`) over a fixed list of documents; `search` is safe to call from threads."""

    def __init__(
        self,
        docs: Sequence[Document],
        *,
        k1: float = 0.9,
        b: float = 0.4,
        stopwords: str | Sequence[str] = "en",
    ):
        import bm25s
        from bm25s.tokenization import Tokenizer

        if not docs:
            raise ValueError("BM25Retriever needs at least one document")
        self.docs = list(docs)
        self._tokenizer = Tokenizer(stopwords=stopwords)
        ids = self._tokenizer.tokenize(
            [d.contents for d in self.docs], update_vocab=True, return_as="ids", show_progress=False
        )
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(ids, show_progress=False)
        self._empty_id = self._tokenizer.get_vocab_dict().get("")
        self._lock = threading.Lock()  # bm25s does not document thread safety

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, **kwargs) -> BM25Retriever:
        return cls(load_corpus(path), **kwargs)

    def search(self, query: str, k: int = 3) -> list[Document]:
        """The (at most) `k` best documents for `query`, best first; only documents that
        share a term with the query."""
        if k < 1:
            return []
        with self._lock:
            (ids,) = self._tokenizer.tokenize(
                [query], update_vocab=False, return_as="ids", show_progress=False
            )
            ids = [i for i in ids if i != self._empty_id]  # words not in the corpus
            if not ids:
                return []
            # numpy top-k: bm25s would pick JAX when it is installed, and tools run in the
            # rollout's worker threads, next to the engine's programs on the same devices.
            found, scores = self._bm25.retrieve(
                [ids], k=min(k, len(self.docs)), show_progress=False, n_threads=0,
                backend_selection="numpy",
            )  # fmt: skip
        return [self.docs[int(i)] for i, s in zip(found[0], scores[0]) if s > 0]


def format_passages(docs: Sequence[Document]) -> str:
    """Search-R1's `_passages2string`: "Doc i(Title: {title}) {text}\\n" per document."""
    return "".join(f"Doc {i}(Title: {d.title}) {d.text}\n" for i, d in enumerate(docs, 1))


def information_block(docs: Sequence[Document], special_tokens: Sequence[str] = ()) -> str:
    """The observation appended after "</search>" (Search-R1's `execute_predictions`); the
    strings of `special_tokens` in the passages are neutralised (`tools.special_tokens`)."""
    passages = neutralise_special_tokens(format_passages(docs).strip(), special_tokens)
    return f"\n\n<information>{passages}</information>\n\n"


def pending_query(text: str) -> str | None:
    """The query of a response that has just stopped on "</search>": the text between the
    last "<search>" and the final "</search>", stripped. None when the text does not end in
    "</search>" or that span holds no well-formed query (no opening tag in this call)."""
    if not text.endswith(SEARCH_END):
        return None
    start = text.rfind(SEARCH_START)
    if start < 0:
        return None
    query = text[start + len(SEARCH_START) : -len(SEARCH_END)]
    return None if SEARCH_END in query else query.strip()


@dataclasses.dataclass
class SearchTool:
    """The Search-R1 tool callback for `RolloutDriver.generate(..., tool=search_tool)`.

    The driver passes the response so far, ending with the stop string it stopped on (see
    `stop_strings`, to be put in `SamplingParams.stop`):
      - "...<search> q </search>": returns `information_block(retriever.search(q, k))`;
      - "...</search>" without an opening tag in the call: Search-R1's invalid-action text;
      - "...</answer>" (or anything else): None, which ends the sample.
    """

    retriever: BM25Retriever
    k: int = 3
    # The policy tokenizer's special-token strings, neutralised in the passages (a corpus
    # is outside text); `build_tool` fills them in.
    special_tokens: tuple[str, ...] = ()
    name: str = "search"
    stop_strings: tuple[str, ...] = (SEARCH_END, ANSWER_END)

    def __call__(self, text: str) -> str | None:
        if not text.endswith(SEARCH_END):
            return None
        query = pending_query(text)
        if query is None:
            return INVALID_ACTION
        return information_block(self.retriever.search(query, self.k), self.special_tokens)


def make_search_tool(
    corpus_path: str | os.PathLike | Path,
    k: int = 3,
    special_tokens: Sequence[str] = (),
    **bm25,
) -> SearchTool:
    """A `SearchTool` over the jsonl corpus at `corpus_path` returning the top `k` passages
    (Search-R1's default topk is 3), neutralising `special_tokens` in them. `bm25`:
    `BM25Retriever` options (k1, b, stopwords)."""
    retriever = BM25Retriever.from_jsonl(corpus_path, **bm25)
    return SearchTool(retriever, k=int(k), special_tokens=tuple(special_tokens))
