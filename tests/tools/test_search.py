"""The Search-R1 search tool: corpus loading, BM25 retrieval, the observation format."""

import concurrent.futures
import json

import pytest

from jaxrl_llm.tools import Tool
from jaxrl_llm.tools.search import (
    INVALID_ACTION,
    BM25Retriever,
    Document,
    format_passages,
    information_block,
    load_corpus,
    make_search_tool,
    pending_query,
)

ROWS = [
    {"id": "0", "contents": '"Zorvath"\nZorvath was born in Quellin.'},
    {"id": "1", "contents": '"Mirela"\nMirela was born in Oskarn.\nShe farmed barley.'},
    {"id": 2, "title": "Fendar", "text": "The capital of Fendar is Trell."},
    {"id": "3", "title": "Quellin", "text": "Quellin is a town on the river Vask."},
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")  # a blank line is skipped
    return path


def test_load_corpus_both_row_formats(corpus):
    docs = load_corpus(corpus)
    assert [d.id for d in docs] == ["0", "1", "2", "3"]
    assert (
        docs[1].title == '"Mirela"'
        and docs[1].text == "Mirela was born in Oskarn.\nShe farmed barley."
    )
    assert docs[2].contents == "Fendar\nThe capital of Fendar is Trell."
    assert (docs[2].title, docs[2].text) == ("Fendar", "The capital of Fendar is Trell.")


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "not JSON"), ('{"contents": "x"}', "'id'"), ('{"id": 1, "title": "t"}', "text")],
)
def test_malformed_corpus_row_names_its_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{message}"):
        load_corpus(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no documents"):
        load_corpus(path)


def test_bm25_ranks_the_matching_document_first(corpus):
    retriever = BM25Retriever.from_jsonl(corpus)
    assert [d.id for d in retriever.search("Where was Zorvath born?", 1)] == ["0"]
    assert [d.id for d in retriever.search("capital of fendar", 3)] == ["2"]  # only matches
    # "Quellin" is in two documents; the one about it (title and text) ranks first.
    assert [d.id for d in retriever.search("Quellin", 3)] == ["3", "0"]
    assert len(retriever.search("born", 10)) == 2  # k beyond the corpus is fine
    assert retriever.search("entirely unknown words", 3) == []
    assert retriever.search("the of is", 3) == []  # stopwords only
    assert retriever.search("Zorvath", 0) == []


def test_passages_and_information_block_follow_search_r1():
    docs = [Document("a", '"T1"\nline one\nline two'), Document("b", "T2\nsecond")]
    assert (
        format_passages(docs) == 'Doc 1(Title: "T1") line one\nline two\nDoc 2(Title: T2) second\n'
    )
    # Search-R1 strips the joined passages inside the tags.
    assert information_block(docs) == (
        '\n\n<information>Doc 1(Title: "T1") line one\nline two\nDoc 2(Title: T2) second'
        "</information>\n\n"
    )
    assert information_block([]) == "\n\n<information></information>\n\n"


def test_pending_query_takes_this_turns_search():
    assert pending_query("<think>hm</think><search> where is x </search>") == "where is x"
    earlier = "<search>a</search>\n\n<information>Doc 1(Title: t) x</information>\n\n"
    assert pending_query(earlier + "<search>b</search>") == "b"
    assert pending_query(earlier + "junk</search>") is None  # no opening tag this turn
    assert pending_query("no tags</search>") is None
    assert pending_query("<search>q</search> then more") is None
    assert pending_query("<search></search>") == ""


def test_search_tool_callback(corpus):
    tool = make_search_tool(corpus, k=2)
    assert isinstance(tool, Tool) and tool.stop_strings == ("</search>", "</answer>")
    obs = tool("<think>I must look it up.</think>\n<search> Zorvath born </search>")
    assert obs == (
        '\n\n<information>Doc 1(Title: "Zorvath") Zorvath was born in Quellin.\n'
        'Doc 2(Title: "Mirela") Mirela was born in Oskarn.\nShe farmed barley.</information>\n\n'
    )
    assert tool("<answer> Quellin </answer>") is None
    assert tool("nothing to do") is None
    assert tool("oops</search>") == INVALID_ACTION
    assert make_search_tool(corpus, k=1)("<search>Zorvath</search>").count("Doc ") == 1


def test_concurrent_searches_match_serial(corpus):
    tool = make_search_tool(corpus, k=3)
    texts = [f"<search> {q} </search>" for q in ("Zorvath", "Fendar", "Quellin", "Oskarn")] * 8
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # as the samplers call tools
        assert list(pool.map(tool, texts)) == [tool(t) for t in texts]
