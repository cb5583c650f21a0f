"""`jaxrl-llm serve`: JetStream's Driver and gRPC Orchestrator service over our `Engine`.

Clients use JetStream's own stubs (`jetstream_pb2_grpc.OrchestratorStub`): `Decode` with
text or token-id content streams samples back; `HealthCheck` reports liveness.

What we add around JetStream's pieces, and why:
- Requests are validated before they reach the Driver: its worker threads SIGKILL the
  whole process on any exception, so an empty prompt, an out-of-vocabulary id or a prompt
  longer than the engine's max prefill length (counting the BOS the Driver prepends, where
  the tokenizer has one) must be answered with INVALID_ARGUMENT instead of crashing the
  server. Any max prefill length works: prompts are padded to the engine's own buckets
  (`jetstream_compat.prefill_buckets`), not JetStream's fixed list.
- A text request's samples are re-decoded as they stream (`jetstream_compat.StreamedText`):
  JetStream decodes each token alone, so a character split across tokens (any non-ASCII
  one with a byte-level BPE, as Qwen's) came out as U+FFFDs. Token-id requests get ids only.
- Token-id content is padded by our tokenizer (JetStream's `pad_tokens` prepends the BOS
  id unconditionally, which is None for Qwen).
- Params are read through a `ParamsRef` at every call: attached to a training run
  (`start_server(..., params=ref)` and `ref.value = new_params` after each step), the
  server samples with the latest weights without restarting the Driver's threads.
- Shutdown on SIGINT/SIGTERM: `Driver.stop()` then the gRPC server (1 s grace). The "hang"
  seen with JetStream's own orchestrator test is not a deadlock: its MockEngine does two
  4096x4096 float32 matmuls of fake work per step (sized for a TPU), measured here at
  ~24 s per generate step on 2 CPU cores. The generate thread dispatches steps ahead, the
  detokenize thread waits in `np.array` for each (up to 8 queued, minutes), and `stop()`
  joins them. With this engine a step takes milliseconds and stop returns at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from jaxrl_llm.rollout.engine import Engine
from jaxrl_llm.rollout.jetstream_compat import HFTokenizer, StreamedText, patch_orchestrator
from jaxrl_llm.rollout.loading import add_model_arguments, load_sampling_model
from jaxrl_llm.rollout.prompt_checks import prompt_problem
from jaxrl_llm.rollout.records import ParamsRef

log = logging.getLogger(__name__)

orchestrator = patch_orchestrator()
from jetstream.core import server_lib  # noqa: E402  (after the patch)
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402

_DecodeResponse = jetstream_pb2.DecodeResponse  # pyright: ignore[reportAttributeAccessIssue]


class _Driver(orchestrator.Driver):
    def _process_prefill_content(self, request, tokenizer, is_bos, max_prefill_length):
        content = request.prefill_content
        if isinstance(content, str):
            return tokenizer.encode(
                content, is_bos=is_bos, max_prefill_length=max_prefill_length, jax_padding=False
            )
        assert isinstance(tokenizer, HFTokenizer)  # built by `Engine.build_tokenizer`
        return tokenizer.pad(
            content, is_bos=is_bos, max_prefill_length=max_prefill_length, jax_padding=False
        )


class _Orchestrator(orchestrator.LLMOrchestrator):
    """JetStream's servicer with request validation in front of the Driver."""

    def __init__(self, driver, engine: Engine, tokenizer):
        super().__init__(driver=driver)
        self._engine, self._tokenizer = engine, tokenizer

    def _problem(self, request) -> str | None:
        if request.max_tokens <= 0:
            return "max_tokens must be positive"
        which = request.WhichOneof("content")
        if which is None:
            return "request has neither text_content nor token_content"
        if which == "text_content":
            ids = self._tokenizer.hf(request.text_content.text, add_special_tokens=False)
            ids = ids["input_ids"]
        else:
            ids = list(request.token_content.token_ids)
        # The samplers' own rule (empty, out of the vocabulary); the length is checked below,
        # counting the BOS the Driver adds.
        vocab = self._engine.config.vocab_size
        problem = prompt_problem(np.asarray(ids, np.int64), None, vocab)
        if problem is not None:
            return problem
        # The Driver prepends the BOS, where the tokenizer has one, unless the request
        # continues a session (JetStream's `is_bos = not history_path`).
        length = len(ids) + (self._tokenizer.bos_id is not None and not request.session_cache)
        if length > self._engine.max_prefill_length:
            return f"prompt of {length} tokens exceeds {self._engine.max_prefill_length}"
        return None

    async def Decode(self, request, context=None):
        problem = self._problem(request)
        if problem is not None:
            if context is None:
                raise ValueError(problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.WhichOneof("content") == "token_content":  # ids only: the client decodes
            async for response in super().Decode(request, context):
                yield response
            return
        # JetStream decodes each token alone: a character split across tokens (any non-ASCII
        # one with a byte-level BPE) came out as U+FFFDs. Each sample's text is redone here.
        streams: list[StreamedText] = []
        async for response in super().Decode(request, context):
            samples = response.stream_content.samples
            streams += [StreamedText(self._tokenizer.decode) for _ in samples[len(streams) :]]
            for sample, stream in zip(samples, streams, strict=True):
                sample.text = stream.add(sample.token_ids)
            yield response
        rest = [stream.flush() for stream in streams]
        if any(rest):  # text only: its ids went out with the responses above
            samples = [_DecodeResponse.StreamContent.Sample(text=text) for text in rest]
            yield _DecodeResponse(stream_content=_DecodeResponse.StreamContent(samples=samples))


class Server(server_lib.JetStreamServer):
    """JetStream's server (asyncio loop thread + grpc.aio) with our servicer and host."""

    def __init__(self, driver, servicer, *, host: str, port: int, threads: int):
        self._executor = futures.ThreadPoolExecutor(max_workers=threads)
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(self._executor)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._loop_thread.start()

        async def make():
            return grpc.aio.server(self._executor)

        self._grpc_server = asyncio.run_coroutine_threadsafe(make(), self._loop).result()
        self._driver = driver
        jetstream_pb2_grpc.add_OrchestratorServicer_to_server(servicer, self._grpc_server)
        self.port = self._grpc_server.add_insecure_port(f"{host}:{port}")

    async def _async_stop(self) -> None:
        await self._grpc_server.stop(grace=1)


def start_server(
    engine: Engine,
    *,
    params: Any = None,
    host: str = "127.0.0.1",
    port: int = 0,
    threads: int | None = None,
) -> Server:
    """Start serving `engine` (params: a tree or a `ParamsRef`; default the engine's)."""
    ref = params if isinstance(params, ParamsRef) else ParamsRef(params or engine.load_params())
    tokenizer = engine.build_tokenizer(engine.get_tokenizer())
    driver = _Driver(
        prefill_engines=[engine],
        generate_engines=[engine],
        prefill_params=[ref],
        generate_params=[ref],
        interleaved_mode=True,
        jax_padding=False,
    )
    servicer = _Orchestrator(driver, engine, tokenizer)
    threads = threads or max(driver.get_total_concurrent_requests(), 16)
    server = Server(driver, servicer, host=host, port=port, threads=threads)
    server.start()
    log.info("serving on %s:%d with %d slots", host, server.port, engine.batch)
    return server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)  # --checkpoint, --mesh, --dtype
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000, help="0 = any free port")
    parser.add_argument("--slots", type=int, default=8, help="concurrent decode slots")
    parser.add_argument("--max-cache-length", type=int, default=512)
    parser.add_argument("--max-prefill-length", type=int, default=256)


def check_serve_flags(args: argparse.Namespace) -> None:
    """`serve`'s flags, each in its range, or a `ConfigError` naming the flag, before any
    model loads (as `generate` and `eval` check theirs)."""
    from jaxrl_llm.config_checks import ConfigError
    from jaxrl_llm.rollout.commands import check_mesh_flag, check_sampling_flags

    check_sampling_flags(args)  # --slots
    check_mesh_flag(args.mesh)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port = {args.port}: expected 0 (any free port) to 65535")
    if not 1 <= args.max_prefill_length < args.max_cache_length:
        raise ConfigError(
            f"--max-prefill-length = {args.max_prefill_length}, --max-cache-length = "
            f"{args.max_cache_length}: expected 1 <= prefill < cache length (the rest of the "
            "cache holds the generated tokens)"
        )


def main(args: argparse.Namespace) -> int:
    check_serve_flags(args)
    loaded = load_sampling_model(args)
    engine = Engine(
        loaded.model,
        max_concurrent_decodes=args.slots,
        max_cache_length=args.max_cache_length,
        max_prefill_length=args.max_prefill_length,
        mesh=loaded.mesh,
        tokenizer=loaded.tokenizer,
        checkpoint_path=str(loaded.path),
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = start_server(engine, host=args.host, port=args.port)
    print(f"READY {args.host}:{server.port}", flush=True)
    stop.wait()
    server.stop()
    print("STOPPED", flush=True)
    return 0
