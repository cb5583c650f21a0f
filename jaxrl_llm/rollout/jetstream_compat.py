"""The one place that adapts google-jetstream 0.2.2 to current JAX and to our checkpoints.

What it fixes, and why:
0. `jetstream.engine.engine_api` imports `token_utils` at module level, and `token_utils`
   imports seqio, which imports TensorFlow (measured: 5.8 s and 840 MB RSS for the import,
   plus TensorFlow's start-up banner on stderr). The Engine API reads `token_utils` only
   inside `Engine.build_tokenizer`'s default, which ours overrides; the training path
   never calls it. So before `engine_api` is imported, `token_utils` is registered as a
   `_DeferredModule`: it is imported (and pulls in seqio) only when a public name of it is
   first read, which happens in `jaxrl-llm serve` (JetStream's orchestrator and
   `HFTokenizer.pad`), never in training. Not `importlib.util.LazyLoader`: that loads on
   any attribute, and libraries that scan `sys.modules` (torch's dynamo reads `__file__`
   and the like of every module) then import TensorFlow mid-way through their own import
   (measured: a segfault importing triton after TensorFlow with the CUDA torch wheel). If
   something imported it already, the loaded module is used as is. Before it loads,
   triton is imported when installed (`_load_triton_first`): after TensorFlow, triton's
   import aborts the process on LLVM's command-line options, registered by both.
1. `jetstream.core.orchestrator.delete_pytree` calls `jax.tree_map`, removed from JAX.
   `patch_orchestrator()` rebinds that module-level function to one using `jax.tree.map`
   (the generate thread looks the name up in the module at call time), rather than
   re-adding `jax.tree_map` to JAX for everybody. It also undoes the DEBUG root logging
   that module's import installs, and sends the module's own `logging.info` /
   `logging.warning` calls (two INFO lines per decode step) to a logger of its own,
   `jetstream.orchestrator`, at WARNING: the root logger is at INFO in `jaxrl-llm`.
2. `HFTokenizer`: a JetStream `Tokenizer` over a `transformers` tokenizer. JetStream's own
   tokenizers are SentencePiece and tiktoken only. Its stop tokens are the checkpoint's
   EOS ids only: JetStream's default adds the pad id, but a pad id may be a real token
   (id 0 is a byte in the shipped tokenizer).
   Its `pad` hands JetStream's `pad_tokens` the engine's own prompt widths
   (`prefill_buckets`: 16, 32, ... below the max prefill length, then that length):
   `pad_tokens`' default buckets are 16, 32, ... 32768 and it requires the max prefill
   length to be one of them (`prefill_lengths.index(...)`), so any other (40, or an
   engine's default cache - 1) raised in the Driver's prefill thread, which SIGKILLs the
   server. Bucketed widths, not the prompt's own length, keep the engine's prefill compiles
   as few as `Engine.prefill_bucket`'s.
3. `StreamedText`: JetStream's detokenize thread decodes each token alone and holds back
   only SentencePiece's `<0xAB>` pieces, so with a byte-level BPE (Qwen's) every character
   split across tokens came out as U+FFFDs. `jaxrl-llm serve` redoes a text request's
   samples' text with it (`server._Orchestrator.Decode`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)


class _DeferredModule(types.ModuleType):
    """Stands in for a module until one of its public names is read, then imports it.

    Dunder lookups (`__file__`, `__spec__`, ...) are answered without importing, so code
    that scans `sys.modules` does not trigger the import.
    """

    def __init__(self, spec: Any):
        super().__init__(spec.name)
        self.__spec__ = spec
        self.__file__ = spec.origin
        self.__loader__ = spec.loader

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        _load_triton_first()
        real = importlib.import_module(self.__name__)  # also rebinds the package attribute
        self.__dict__.update(real.__dict__)  # holders of this stand-in see the real names
        return getattr(real, attr)


def _load_triton_first() -> None:
    """Import triton, when installed (vLLM and torch bring it), before `token_utils` brings
    TensorFlow. Both carry LLVM and register its command-line options; loaded after
    TensorFlow, triton aborts the process ("LLVM ERROR: inconsistency in registered
    CommandLine options": TensorFlow 2.21, triton 3.9), in the other order both load. A
    process that serves and later imports triton (transformers' masking utilities import
    torch's dynamo, which imports it; so does vLLM) would otherwise die there."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    try:
        importlib.import_module("triton")
    except (ImportError, OSError, RuntimeError) as e:  # a broken triton: serve without it
        log.warning("triton is installed but does not import (%s); a later import of it "
                    "after TensorFlow may abort this process", e)  # fmt: skip


def _defer_module(name: str) -> None:
    """Put a `_DeferredModule` for `name` in `sys.modules` and on its package, unless
    `name` is imported already. On the package too: `from package import name` then reads
    the attribute instead of asking the import system."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(f"{name} not found: is google-jetstream installed?")
    package, _, child = name.rpartition(".")
    sys.modules[name] = module = _DeferredModule(spec)
    setattr(importlib.import_module(package), child, module)


_defer_module("jetstream.engine.token_utils")
from jetstream.engine import (  # noqa: E402  (after token_utils is made lazy)
    engine_api,
    token_utils,
    tokenizer_api,
    tokenizer_pb2,
)

__all__ = [
    "HFTokenizer",
    "StreamedText",
    "engine_api",
    "patch_orchestrator",
    "prefill_buckets",
    "tokenizer_pb2",
]


def _delete_pytree(tree: Any) -> None:
    """`orchestrator.delete_pytree` with `jax.tree.map` (frees a prefix after insert)."""

    def delete_leaf(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()

    jax.tree.map(delete_leaf, tree)


def patch_orchestrator():
    """Import JetStream's orchestrator with its removed-JAX call replaced; returns it."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    from jetstream.core import orchestrator

    # Its import sets the root logger to DEBUG with a stdout handler: undo that.
    root.setLevel(level)
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    # It logs two INFO lines per decode step through the module-level `logging.info`, which
    # reach the root logger (at INFO in `jaxrl-llm`): its functions read only `logging.info`
    # and `logging.warning` after import, so a logger of its own at WARNING takes the name.
    logger = logging.getLogger("jetstream.orchestrator")
    logger.setLevel(logging.WARNING)
    orchestrator.logging = logger
    orchestrator.delete_pytree = _delete_pytree
    return orchestrator


def prefill_buckets(max_prefill_length: int) -> list[int]:
    """The prompt widths `Engine.prefill_bucket` pads to: powers of two from 16 below
    `max_prefill_length`, then `max_prefill_length` itself."""
    widths = [16]
    while widths[-1] < max_prefill_length:
        widths.append(widths[-1] * 2)
    return [w for w in widths if w < max_prefill_length] + [int(max_prefill_length)]


class HFTokenizer(tokenizer_api.Tokenizer):
    """JetStream tokenizer protocol over a Hugging Face tokenizer (fast or slow)."""

    def __init__(self, tokenizer: Any, eos_ids: tuple[int, ...] | None = None):
        self.hf = tokenizer
        if eos_ids is None:
            eos = tokenizer.eos_token_id
            eos_ids = () if eos is None else (int(eos),)
        self.eos_ids = tuple(int(i) for i in eos_ids)

    def encode(self, s: str, **kwargs) -> tuple[Any, int]:
        """Token ids padded to a JetStream prefill bucket, and the true length.

        A BOS token is added only when `is_bos` and the tokenizer has one (Qwen has none).
        """
        is_bos = kwargs.pop("is_bos", True)
        ids = np.asarray(self.hf(s, add_special_tokens=False)["input_ids"], np.int32)
        return self.pad(ids, is_bos=is_bos, **kwargs)

    def pad(self, ids, *, is_bos: bool = True, **kwargs) -> tuple[Any, int]:
        """`ids` (with the BOS first when `is_bos` and there is one) padded to the smallest
        of `prefill_lengths` that holds them (default: `prefill_buckets` of
        `max_prefill_length`), and their true length."""
        ids = np.asarray(ids, np.int32)
        if is_bos and self.bos_id is not None:
            ids = np.concatenate([[self.bos_id], ids]).astype(np.int32)
        longest = kwargs.get("max_prefill_length")
        lengths = kwargs.get("prefill_lengths")
        if lengths is None and longest is not None:
            lengths = prefill_buckets(longest)
        return token_utils.pad_tokens(
            ids,
            0,  # bos_id: not read with is_bos=False (the BOS, if any, is in `ids` already)
            self.pad_id,
            is_bos=False,
            prefill_lengths=lengths,
            max_prefill_length=longest,
            jax_padding=kwargs.get("jax_padding", True),
        )

    def decode(self, token_ids: list[int], **kwargs) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=True)

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return 0 if pad is None else int(pad)

    @property
    def eos_id(self) -> int:
        return self.eos_ids[0] if self.eos_ids else -1

    # None without a BOS token (Qwen); JetStream's base says int, but it reads `bos_id` only
    # in the token-content prefill path that `server._Driver` replaces with `pad`.
    @property
    def bos_id(self) -> int | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        bos = self.hf.bos_token_id
        return None if bos is None else int(bos)

    @property
    def stop_tokens(self) -> set[int]:
        return set(self.eos_ids)


class StreamedText:
    """One sample's streamed text: the decode of its ids, sent as it grows, held back while
    it ends in U+FFFD (a character whose bytes have not all come) and flushed at the end (a
    byte sequence that never completes comes out as U+FFFD, as `decode` has it).

    Each step decodes a window, from the start of the last piece sent (context: SentencePiece
    drops the first token's leading space), not the whole sample, so a step costs the same
    at token 10 and token 10,000 (vLLM's incremental detokenizer does the same). The pieces
    joined equal `decode(all ids)` with a byte-level BPE (Qwen's, Llama 3's), and with
    SentencePiece's byte fallback while the bytes are valid UTF-8: that decoder turns a
    whole invalid run into U+FFFDs, an ASCII byte in it too, which a piece sent cannot undo.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._start = self._sent = 0  # window start; ids[:_sent] are sent

    def add(self, ids: Iterable[int]) -> str:
        """The text to send for `ids`, the sample's next tokens ("" while it is held back)."""
        self._ids.extend(int(i) for i in ids)
        return self._new_text(final=False)

    def flush(self) -> str:
        """The text still held back, at the end of the stream."""
        return self._new_text(final=True)

    def _new_text(self, *, final: bool) -> str:
        if len(self._ids) == self._sent:
            return ""
        known = self._decode(self._ids[self._start : self._sent])
        new = self._decode(self._ids[self._start :])[len(known) :]
        if not final and (not new or new.endswith("\ufffd")):
            return ""
        self._start, self._sent = self._sent, len(self._ids)
        return new
