"""Shared fixtures for the data tests: a tiny character-level tokenizer built in memory."""

import json
import string

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

CHARS = string.printable


def make_char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """One token per character (a BPE model without merges), plus <pad>, <unk> and <eos>."""
    specials = ["<pad>", "<unk>", "<eos>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )


@pytest.fixture(scope="session")
def char_tokenizer_for():
    """``char_tokenizer_for(chars)``: a character-level tokenizer over ``chars``."""
    return make_char_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    return make_char_tokenizer()


def _math_rows(n: int) -> list[dict]:
    return [
        {"id": f"q{i:03d}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i), "source": "t"}
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def math_rows():
    """``math_rows(n)``: ``n`` LIMR-style rows (``id``, ``prompt``, ``answer``, ``source``)."""
    return _math_rows


@pytest.fixture
def math_jsonl(tmp_path):
    """A clean jsonl file of 23 prompts."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _math_rows(23)))
    return path
