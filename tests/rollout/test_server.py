"""`jaxrl-llm serve`: JetStream's Driver + gRPC service over our engine, queried with
JetStream's own client stub. The server runs in a subprocess with timeouts throughout."""

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc


def _serve(cmd):
    """Start a server subprocess (`cmd` prints "READY host:port"); yields (stub, process,
    its output lines) and stops it with SIGINT after."""
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("READY"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(120):
            raise RuntimeError("server did not start:\n" + "".join(lines[-30:]))
        port = int(next(ln for ln in lines if ln.startswith("READY")).rsplit(":", 1)[1])
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield jetstream_pb2_grpc.OrchestratorStub(channel), proc, lines
        channel.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def server():
    # 40: not one of JetStream's prefill buckets (16, 32, 64, ...), which its `pad_tokens`
    # requires of the max prefill length unless given buckets that include it.
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "serve", "--port", "0", "--slots", "4",
           "--max-cache-length", "64", "--max-prefill-length", "40"]  # fmt: skip
    yield from _serve(cmd)


def _text(max_tokens, text):
    content = jetstream_pb2.DecodeRequest.TextContent(text=text)
    return jetstream_pb2.DecodeRequest(text_content=content, max_tokens=max_tokens)


def _collect(stub, request):
    responses = list(stub.Decode(request, timeout=60))
    samples = [s for r in responses for s in r.stream_content.samples]
    return "".join(s.text for s in samples), [t for s in samples for t in s.token_ids]


@pytest.mark.slow  # measured: a server subprocess, 10 s with its fixture (docs/testing.md)
def test_round_trip_concurrent_malformed_and_clean_shutdown(server):
    stub, proc, lines = server
    assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30).is_live
    results = {}

    def client(i):
        results[i] = _collect(stub, _text(6, f"Question {i}: 1+{i}?"))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 12
    for _, ids in results.values():
        assert 1 <= len(ids) <= 6
    # The same prompt twice: greedy by default, so the same answer.
    assert _collect(stub, _text(6, "Question 3: 1+3?")) == results[3]
    tokens = jetstream_pb2.DecodeRequest.TokenContent(token_ids=[40, 41, 42])
    _, ids = _collect(stub, jetstream_pb2.DecodeRequest(token_content=tokens, max_tokens=4))
    assert 1 <= len(ids) <= 4

    def ids(*token_ids):
        content = jetstream_pb2.DecodeRequest.TokenContent(token_ids=list(token_ids))
        return jetstream_pb2.DecodeRequest(token_content=content, max_tokens=3)

    bad = [  # (request, the refusal's words: the samplers' own, rollout/prompt_checks.py)
        (_text(5, ""), "empty prompt"),
        (_text(0, "hi"), "max_tokens must be positive"),
        (_text(5, "x" * 100), "exceeds"),
        (ids(10**6), "token id 1000000 at position 0 is outside the vocabulary"),
        (ids(40, -1), "token id -1 at position 1 is outside the vocabulary"),
        (jetstream_pb2.DecodeRequest(max_tokens=3), "neither text_content nor token_content"),
    ]
    for request, words in bad:
        with pytest.raises(grpc.RpcError) as err:
            _collect(stub, request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert words in err.value.details(), err.value.details()
    assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30).is_live
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    assert proc.wait(timeout=60) == 0, "".join(lines[-30:])
    assert any(ln.startswith("STOPPED") for ln in lines)
    assert time.time() - t0 < 60


@pytest.fixture
def bos_server():
    yield from _serve([sys.executable, "-m", "tests.rollout.bos_server_worker"])


@pytest.mark.slow  # measured: a server subprocess, 19 s with its start (2 CPU cores)
def test_validation_counts_the_bos_the_server_prepends(bos_server):
    """A tokenizer with a BOS token (as Llama's; `bos_server_worker.py`), max prefill 40:
    a prompt of 40 tokens is refused (with the BOS it would be 41), one of 39 is served,
    and the server lives on (a prompt past the limit used to reach the Driver's threads,
    whose failure SIGKILLs the process)."""
    stub, proc, lines = bos_server
    for n, refused in ((40, True), (39, False), (12, False)):
        tokens = jetstream_pb2.DecodeRequest.TokenContent(token_ids=list(range(40, 40 + n)))
        request = jetstream_pb2.DecodeRequest(token_content=tokens, max_tokens=3)
        if refused:
            with pytest.raises(grpc.RpcError) as err:
                _collect(stub, request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert "41 tokens" in str(err.value.details())
        else:
            _, ids = _collect(stub, request)
            assert 1 <= len(ids) <= 3
    text = _collect(stub, _text(3, "x" * 39))[1]  # text content: the same count
    assert 1 <= len(text) <= 3
    with pytest.raises(grpc.RpcError) as err:
        _collect(stub, _text(3, "x" * 40))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30).is_live
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, "".join(lines[-30:])
