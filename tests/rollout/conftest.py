"""Shared tiny models and engines for the rollout tests.

Engines are session-scoped: each compiles its step function once for the whole run.
"""

import pytest

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, init_model, load_tokenizer
from tests.rollout.reference import TINY


@pytest.fixture(scope="session")
def tiny_model():
    return init_model(TINY, seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model):
    from jaxrl_llm.rollout import Engine

    return Engine(tiny_model, max_concurrent_decodes=4, max_cache_length=64, max_prefill_length=32)


@pytest.fixture(scope="session")
def builtin():
    """(model, tokenizer, engine) on the shipped checkpoint (byte-level tokenizer)."""
    from jaxrl_llm.rollout import Engine

    path = builtin_checkpoint()
    model, tok = from_pretrained(path), load_tokenizer(path)
    engine = Engine(model, max_concurrent_decodes=4, max_cache_length=96, tokenizer=tok)
    return model, tok, engine
