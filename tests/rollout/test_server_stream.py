"""`jaxrl-llm serve`'s streamed text and logging, in process: an engine that reports a
scripted token sequence (so a multi-byte character is split across tokens on purpose) on
the shipped byte-level tokenizer (Qwen's kind: a lone UTF-8 byte decodes to U+FFFD).

`jaxrl_llm.rollout.server` is imported inside the slow tests only: JetStream's orchestrator
imports TensorFlow (docs/testing.md), which the fast tier here does not need."""

import ast
import inspect
import logging

import grpc
import jax.numpy as jnp
import numpy as np
import pytest
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.rollout.engine import Engine
from jaxrl_llm.rollout.jetstream_compat import StreamedText


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


class _ScriptedEngine(Engine):
    """Samples as usual but reports `script[k]` as each slot's k-th token: the Driver and
    the servicer see exactly the ids chosen here."""

    script: tuple[int, ...] = ()

    def generate(self, params, decode_state):
        state, result = super().generate(params, decode_state)
        k = jnp.clip(state.generated - 1, 0, len(self.script) - 1)
        data = result.data.at[:, 0].set(jnp.asarray(self.script, jnp.int32)[k])
        return state, result.replace(data=data)


@pytest.fixture(scope="module")
def scripted():
    path = builtin_checkpoint()
    model, tok = from_pretrained(path), load_tokenizer(path)
    lead, cont = _ids(tok, "é")  # é is two byte tokens (0xC3 0xA9)
    # A character split across tokens, a three-byte one, a stray continuation byte (invalid
    # for good) before ASCII, and a lead byte whose character never completes at the end.
    script = [*_ids(tok, "Aé 日b"), cont, *_ids(tok, "x"), lead]
    engine = _ScriptedEngine(
        model, max_concurrent_decodes=2, max_cache_length=64, max_prefill_length=16, tokenizer=tok
    )
    engine.script = tuple(script)
    from jaxrl_llm.rollout.server import start_server

    srv = start_server(engine, port=0)
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield jetstream_pb2_grpc.OrchestratorStub(channel), tok, script
    finally:
        channel.close()
        srv.stop()


def _decode(stub, n, **content):
    if "text" in content:
        req = jetstream_pb2.DecodeRequest(
            text_content=jetstream_pb2.DecodeRequest.TextContent(text=content["text"]),
            max_tokens=n,
        )
    else:
        ids = jetstream_pb2.DecodeRequest.TokenContent(token_ids=content["ids"])
        req = jetstream_pb2.DecodeRequest(token_content=ids, max_tokens=n)
    responses = list(stub.Decode(req, timeout=60))
    return [s for r in responses for s in r.stream_content.samples]


def test_streamed_text_decodes_characters_split_across_tokens():
    tok = load_tokenizer(builtin_checkpoint())
    lead, cont = _ids(tok, "é")
    ids = [*_ids(tok, "Aé 日b"), cont, *_ids(tok, "x"), lead]
    stream = StreamedText(lambda x: tok.decode(x, skip_special_tokens=True))
    pieces = [stream.add([i]) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == "Aé 日b\ufffdx\ufffd"
    assert pieces[0] == "A"  # a complete character goes out with its token
    assert pieces[1:3] == ["", "é"]  # held while incomplete, sent when its last byte comes
    assert pieces[-1] == "\ufffd"  # an incomplete character at the end comes out as U+FFFD


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_streamed_text_equals_the_decode_of_random_bytes(chunk):
    """Any byte sequence (valid UTF-8 or not), a few tokens per response."""
    tok = load_tokenizer(builtin_checkpoint())
    decode = lambda x: tok.decode(x, skip_special_tokens=True)
    rng = np.random.default_rng(chunk)
    # ASCII and non-ASCII bytes alike, so runs split, complete and break characters.
    byte_ids = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    for _ in range(50):
        ids = rng.choice(byte_ids, size=int(rng.integers(1, 40))).tolist()
        stream = StreamedText(decode)
        pieces = [stream.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
        assert "".join([*pieces, stream.flush()]) == decode(ids), ids


@pytest.mark.slow  # measured: ~10 s (the shipped model's compiles, a server in process)
def test_served_text_equals_the_decode_of_the_streamed_ids(scripted):
    stub, tok, script = scripted
    samples = _decode(stub, len(script), text="Hi")
    ids = [t for s in samples for t in s.token_ids]
    assert ids == script
    streamed = "".join(s.text for s in samples)
    assert streamed == tok.decode(ids, skip_special_tokens=True) == "Aé 日b\ufffdx\ufffd"
    assert len([s for s in samples if s.token_ids]) == len(script)  # one response per token
    # Token-id requests get ids only, as JetStream's protocol says (the client decodes).
    samples = _decode(stub, 3, ids=_ids(tok, "Hi"))
    assert [t for s in samples for t in s.token_ids] == script[:3]
    assert not any(s.text for s in samples)


@pytest.mark.slow  # 0.04 s itself, but it needs the fixture above (~2 s, ~9 s with a request)
def test_a_request_logs_no_per_step_info_lines(scripted, caplog):
    """`jaxrl-llm serve` logs at INFO (cli.py's basicConfig); JetStream's orchestrator logs
    two INFO lines per decode step through its module-level `logging.info`. Every
    `logging.X` it reads inside a function (after its import) must exist on the logger
    `patch_orchestrator` binds to that name."""
    from jaxrl_llm.rollout.server import orchestrator

    stub, _, script = scripted
    caplog.set_level(logging.INFO)
    _decode(stub, len(script), text="Hi")
    chatter = [r for r in caplog.records if "orchestrator" in r.pathname]
    assert not [r for r in chatter if r.levelno < logging.WARNING], chatter[:3]

    tree = ast.parse(inspect.getsource(orchestrator))
    used = {
        node.attr
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "logging"
    }
    assert used, "no logging calls found: has JetStream's orchestrator changed?"
    assert isinstance(orchestrator.logging, logging.Logger)
    assert orchestrator.logging.getEffectiveLevel() == logging.WARNING
    assert not sorted(name for name in used if not hasattr(orchestrator.logging, name))
