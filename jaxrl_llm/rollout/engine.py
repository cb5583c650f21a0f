"""`Engine`: the JetStream Engine API over our `CausalLM`, sharing the trainer's weights.

Params are an argument of every call. Handing the engine the trainer's current params is
the whole weight sync: `place_params` returns the very same arrays when they already have
the sampling layout (zero bytes copied) and runs one jitted reshard when they do not
(e.g. FSDP training layout -> tensor-parallel sampling layout). A `ParamsRef` can stand in
for params where a caller captures them once (JetStream's Driver threads): it is read at
every call, so a server attached to a training run always uses the latest step.

Every device program (`rollout.programs.DecodePrograms`) is jitted here with explicit in/out
shardings under the engine's rules (`SAMPLE_RULES` by default) and donates the decode state
it transforms.

Decode state: a paged KV cache (`models.paged`: per layer a pool of pages, updated in place
on the donated state; per slot a page-table row), and per slot b of B the hidden state of
the row's last cached token, how many tokens the row holds, the sampling parameters and
token budget, and an active flag. A decode step reads only the pages its rows use. The
host side (`rollout.pages.SlotPages`) reserves a sample's pages at insert, shares a
prompt's full pages among the samples inserted from one prefix, and frees them on
`release_slot` (a prompt's full pages once `release_prompt` says no more of its samples
come); `can_insert` says whether the pool has room (callers queue otherwise).
When the slots split over the sampling mesh's batch axes (D devices), the pool splits with
them into D page ranges: a slot takes pages only from its device's range and a decode step
runs per device (`models.paged.write_and_decode`), so each device holds 1/D of the cache.
Prefill computes no logits (JetStream 0.2.2 returns only a prefix): a step samples from the
stored hidden state's logits, so each of n samples of one prefix draws its first token in
its own slot with its own seed.

Shapes: B slots, S cache length (the longest sequence), P padded prompt, D embed, L layers,
K kv heads, H head dim, NP pages in the pool, ps page size, pps = ceil(S / ps).
"""

from __future__ import annotations

import functools
import math
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.models import CausalLM
from jaxrl_llm.models.kv_int8 import pool_bytes_per_token, pool_dtype
from jaxrl_llm.models.paged import batch_axes
from jaxrl_llm.rollout import layouts
from jaxrl_llm.rollout.ahead import AheadCompiles
from jaxrl_llm.rollout.jetstream_compat import HFTokenizer, engine_api, tokenizer_pb2
from jaxrl_llm.rollout.pages import SlotPages
from jaxrl_llm.rollout.programs import DecodePrograms
from jaxrl_llm.rollout.prompt_checks import prompt_problem, prompt_problems, refusal
from jaxrl_llm.rollout.records import DecodeState, ParamsRef, Prefix, StepRecords
from jaxrl_llm.rollout.sampling import SamplingParams, SlotSampling, sample_seed
from jaxrl_llm.sharding import SAMPLE_RULES, ShardingContext, build_mesh, reshard
from jaxrl_llm.sharding.reshard import abstract, target_shardings
from jaxrl_llm.sharding.rules import Rules

Array = jax.Array
# protoc's Python output builds its message classes at import, so no checker can see them.
TokenizerParameters: TypeAlias = tokenizer_pb2.TokenizerParameters  # pyright: ignore[reportAttributeAccessIssue]


class Engine(engine_api.Engine):
    """JetStream-API engine: `prefill`, `insert`, `generate`, plus what RL needs.

    Extra methods used by `rollout.driver`: `insert_slot` (per-slot sampling and budget),
    `generate_steps` (k steps per call; `compile_steps_ahead` compiles its program on a
    thread as a rollout starts), `append_tokens` (tool output into a live slot),
    `deactivate`, `place_params`, `can_insert`, `release_prompt`, `release_slot`.
    `trace_counts` counts traces (= compiles) per function.

    `page_size` tokens per page; `num_pages` in the pool (default: every slot can hold a
    full-length sequence, the memory of a dense cache; fewer trade concurrency for memory);
    `kv_dtype` of the cache (default: the model's compute dtype; int8: quantised per token
    and head, `models.kv_int8.Int8Pages`).
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        max_concurrent_decodes: int = 8,
        max_cache_length: int = 512,
        max_prefill_length: int | None = None,
        mesh: Mesh | None = None,
        rules: Rules = SAMPLE_RULES,
        tokenizer: Any = None,
        checkpoint_path: str | None = None,
        default_sampling: SamplingParams | None = None,
        eos_ids: tuple[int, ...] | None = None,
        keep_params: bool = True,
        page_size: int = 32,
        num_pages: int | None = None,
        kv_dtype: Any = None,
    ):
        """`keep_params=False`: hold no weights of its own (the RL trainer passes its live
        params to every call), so a layout change does not pin a second copy in memory."""
        self.config = model.config
        self._mesh = mesh if mesh is not None else build_mesh(1, 1, 1, devices=jax.devices()[:1])
        self.ctx = ShardingContext(self._mesh, rules)
        self.batch = int(max_concurrent_decodes)
        self.cache_length = int(max_cache_length)
        self._max_prefill = int(max_prefill_length or self.cache_length - 1)
        if self._max_prefill >= self.cache_length:
            raise ValueError("max_prefill_length must leave cache room for generated tokens")
        self.tokenizer = tokenizer
        self.checkpoint_path = checkpoint_path
        self.default_sampling = default_sampling or SamplingParams(temperature=0.0)
        self._inserts = 0  # JetStream inserts so far: each sample's seed (`insert`)
        eos = self.config.eos_token_ids if eos_ids is None else tuple(eos_ids)
        self.eos_ids = np.asarray(eos or (-1,), np.int32)
        self.page_size = int(page_size)
        self.pages_per_seq = -(-self.cache_length // self.page_size)
        # Slots split over the batch axes, and so does the pool: D equal page ranges.
        self.batch_axes = batch_axes(self.ctx, self.batch)
        shards = math.prod(self._mesh.shape[n] for n in self.batch_axes)
        pages = int(num_pages or self.batch * self.pages_per_seq)
        self.num_pages = -(-pages // shards) * shards
        self.kv_dtype = pool_dtype(kv_dtype or self.config.dtype)
        self.pages = SlotPages(
            self.batch, self.num_pages, self.page_size, self.pages_per_seq, shards=shards
        )

        graphdef, state = nnx.split(model)
        engine_model = nnx.merge(graphdef, state)  # a fresh module tree; same arrays
        engine_model.set_sharding(self.ctx)
        engine_graphdef, abstract = nnx.split(engine_model)
        self.param_shardings = target_shardings(abstract, self._mesh, rules)
        self._params = self.place_params(state) if keep_params else None
        self.programs = DecodePrograms(
            engine_graphdef, self.config, batch=self.batch, cache_length=self.cache_length,
            page_size=self.page_size, pages_per_seq=self.pages_per_seq,
            num_pages=self.num_pages, kv_dtype=self.kv_dtype, eos_ids=self.eos_ids,
        )  # fmt: skip
        self.trace_counts = self.programs.trace_counts
        self._ahead = AheadCompiles()
        self._build()

    # ----------------------------------------------------------------- shardings
    def _state_shardings(self) -> DecodeState[NamedSharding]:
        return layouts.decode_state(
            self.ctx, self.config, batch=self.batch, num_pages=self.num_pages,
            page_size=self.page_size, pages_per_seq=self.pages_per_seq,
            batch_axes=self.batch_axes, kv_dtype=self.kv_dtype,
        )  # fmt: skip

    # ------------------------------------------------------------------- params
    def place_params(self, params: Any) -> Any:
        """`params` in the sampling layout: the same arrays when already there (no copy)."""
        if isinstance(params, ParamsRef):
            params = params.value
        return reshard(params, self.param_shardings)

    # -------------------------------------------------------------- jitted fns
    def _build(self) -> None:
        """Jit the device programs with the engine's shardings; the state they transform
        is donated."""
        prog, P, R = self.programs, self.param_shardings, layouts.replicated(self.ctx)
        st, pre = self._state_shardings(), self.get_prefix_destination_sharding()
        rec = layouts.step_records(self.ctx, self.batch)
        slot_sampling = SlotSampling(R, R, R, R, R)
        self._prefill_fn = jax.jit(prog.prefill, in_shardings=(P, R, R), out_shardings=pre)
        self._init_fn = jax.jit(prog.init, out_shardings=st)
        self._insert_fn = jax.jit(
            prog.insert,
            in_shardings=(pre, st, R, R, R, R, slot_sampling, R),
            out_shardings=st,
            donate_argnums=(1,),
        )
        self._append_fn = jax.jit(
            prog.append,
            in_shardings=(P, st, R, R, R, R, slot_sampling, R),
            out_shardings=st,
            donate_argnums=(1,),
        )
        self._deactivate_fn = jax.jit(
            prog.deactivate, in_shardings=(st, R), out_shardings=st, donate_argnums=(0,)
        )

        @functools.cache
        def steps_fn(num_steps: int):
            return jax.jit(
                functools.partial(prog.steps, num_steps),
                in_shardings=(P, st),
                out_shardings=(st, rec),
                donate_argnums=(1,),
            )

        self._steps_fn = steps_fn

    # ------------------------------------------------------------ JetStream API
    def load_params(self, *args, **kwargs) -> Any:
        """The params the engine was built with, in the sampling layout."""
        if self._params is None:
            raise ValueError("this engine was built with keep_params=False: pass params=")
        return self._params

    def init_decode_state(self, *args, **kwargs) -> DecodeState:
        return self._init_fn()

    def prefill(
        self,
        *,
        params: Any,
        existing_prefix: Prefix | None = None,
        padded_tokens: Any,
        true_length: int,
    ) -> Prefix:
        """KV cache of a padded prompt [P] (first `true_length` tokens real) and its last
        hidden state. Continuing a live sequence goes through `append_tokens` instead."""
        if existing_prefix is not None:
            raise NotImplementedError("prefill on an existing prefix; use append_tokens")
        tokens = np.asarray(padded_tokens, np.int32).reshape(-1)
        if not 0 < int(true_length) <= tokens.shape[0]:
            raise ValueError(f"true_length {true_length} outside (0, {tokens.shape[0]}]")
        # The drivers' rule (`prompt_checks`): an id outside the vocabulary embeds as NaN.
        problem = prompt_problem(tokens, self._max_prefill, None) or prompt_problem(
            tokens[: int(true_length)], None, self.config.vocab_size
        )
        if problem:
            raise ValueError(problem)
        lengths = np.asarray([true_length], np.int32)
        prefix = self._prefill_fn(self.place_params(params), tokens[None], lengths)
        self.pages.register(prefix, [int(true_length)])
        return prefix

    def prefill_many(self, params: Any, prompts: list[np.ndarray]) -> Prefix:
        """Prefill several prompts in one call: padded to one bucketed width and to a
        power-of-two count (so compiles stay few); insert prompt m with `row=m`."""
        width = self.prefill_bucket(max(len(p) for p in prompts))
        rows = 1 << (len(prompts) - 1).bit_length()
        tokens = np.zeros((rows, width), np.int32)
        lengths = np.ones(rows, np.int32)  # padding rows: one token, never inserted
        problems = prompt_problems(prompts, self._max_prefill, self.config.vocab_size)
        if problems:
            raise refusal(problems)
        for m, p in enumerate(prompts):
            tokens[m, : len(p)], lengths[m] = p, len(p)
        prefix = self._prefill_fn(self.place_params(params), tokens, lengths)
        self.pages.register(prefix, [len(p) for p in prompts])
        return prefix

    def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
        """Insert with the engine's default sampling (used by JetStream's Driver). Each
        insert samples with its own seed, `sample_seed(seed, inserts so far, 0)`: one seed
        for every slot gave the same prompt the same "random" tokens in each."""
        p = self.default_sampling
        budget = self.cache_length  # the Driver enforces its own max_tokens (all pages fit)
        seed = sample_seed(p.seed, self._inserts, 0)
        self._inserts += 1
        state = self.insert_slot(prefix, decode_state, slot, SlotSampling.one(p, seed), budget)
        self.release_prompt(prefix)  # one insert per prefix: its pages go with the slot
        return state

    def generate(
        self, params: Any, decode_state: DecodeState
    ) -> tuple[DecodeState, engine_api.ResultTokens]:
        """One decode step for every slot -> (state, ResultTokens [B, 3]: token, valid, length)."""
        state, rec = self.generate_steps(params, decode_state, 1)
        data = jnp.stack([rec.tokens[0], rec.valid[0].astype(jnp.int32), state.generated], -1)
        return state, engine_api.ResultTokens(
            data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3), samples_per_slot=1
        )

    def get_prefix_destination_sharding(self) -> Prefix[NamedSharding]:
        return layouts.prefix(self.ctx, self.config, self._max_prefill)

    def get_tokenizer(self) -> TokenizerParameters:
        return TokenizerParameters(path=str(self.checkpoint_path or ""))

    def build_tokenizer(self, metadata: TokenizerParameters) -> HFTokenizer:
        tok = self.tokenizer
        if tok is None:
            from jaxrl_llm.models import load_tokenizer

            tok = load_tokenizer(metadata.path)
        return HFTokenizer(tok, tuple(int(i) for i in self.eos_ids if i >= 0))

    @property
    def max_concurrent_decodes(self) -> int:
        return self.batch

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def max_prefill_length(self) -> int:
        return self._max_prefill

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def colocated_cpus(self) -> None:
        return None

    # ---------------------------------------------------------- RL extensions
    def insert_slot(
        self,
        prefix: Prefix,
        state: DecodeState,
        slot: int,
        sampling: SlotSampling[np.generic],
        max_new: int,
        row: int = 0,
    ) -> DecodeState:
        """Insert `prefix` at `slot` with its own sampling parameters and token budget
        (releasing the pages the slot held). Samples inserted from the same prefix share
        its full pages. `row`: which of the prefix's prompts (`prefill_many`). ValueError
        when the pool lacks room (see `can_insert`)."""
        key = (prefix, int(row))
        length = self._prefix_length(*key)
        self.pages.release(int(slot))  # what the slot held before is free again
        if not self.pages.fits(key, length, max_new, slot):
            raise ValueError(
                f"KV pool full: a {length}-token prompt with {max_new} new tokens needs "
                f"{self.pages.needed(key, length, max_new, slot)} pages, "
                f"{self.pages.allocators[self.pages.shard_of(slot)].num_free} free on its "
                "shard (release finished slots first)"
            )
        width = prefix.cache.k.shape[2]
        page_row, dest = self.pages.admit(int(slot), key, length, int(max_new), width)
        args = (np.int32(slot), np.int32(row), page_row, dest, sampling, np.int32(max_new))
        return self._insert_fn(prefix, state, *args)

    def _prefix_length(self, prefix: Prefix, row: int) -> int:
        known = self.pages.known_length((prefix, row))
        # A prefix that crossed JetStream's transfer thread is a new object: read it (once).
        return known if known is not None else int(prefix.length[row])

    def can_insert(self, prefix: Prefix, max_new: int, row: int = 0, slot: int = 0) -> bool:
        """Whether the pool has the pages one more sample of `prefix` (prompt `row`) needs
        in `slot` (pages come from the slot's shard of the pool)."""
        length = self._prefix_length(prefix, row)
        return self.pages.fits((prefix, row), length, int(max_new), int(slot))

    def release_prompt(self, prefix: Prefix, row: int = 0) -> None:
        """No more samples will be inserted from `prefix`'s prompt `row`: its full pages go
        back to the pool with the last slot that uses them (`SlotPages.unshare`)."""
        self.pages.unshare((prefix, int(row)))

    def release_slot(self, slot: int) -> None:
        """Free a finished slot's pages (host bookkeeping only; its row is inactive)."""
        self.pages.release(int(slot))

    def kv_bytes_per_token(self) -> int:
        cfg = self.config
        per_layer = pool_bytes_per_token(2 * cfg.num_kv_heads, cfg.head_dim, self.kv_dtype)
        return cfg.num_layers * per_layer

    def kv_pool_bytes(self) -> int:
        return self.num_pages * self.page_size * self.kv_bytes_per_token()

    def generate_steps(
        self, params: Any, state: DecodeState, num_steps: int
    ) -> tuple[DecodeState, StepRecords]:
        """`num_steps` decode steps in one call (a scan; skipped when no slot is active)."""
        self._ahead.wait(int(num_steps))
        return self._steps_fn(int(num_steps))(self.place_params(params), state)

    def compile_steps_ahead(self, params: Any, num_steps: int) -> None:
        """Compile `generate_steps`' program for `params` (placed) on a thread, once
        (`rollout/ahead.py`); its first call waits for it."""
        state = lambda: jax.eval_shape(self._init_fn)
        lower = lambda: self._steps_fn(int(num_steps)).lower(abstract(params), state())
        self._ahead.start(int(num_steps), lower)

    def append_tokens(
        self,
        params: Any,
        state: DecodeState,
        slot: int,
        tokens: np.ndarray,
        start: int,
        sampling: SlotSampling[np.generic],
        max_new: int,
    ) -> DecodeState:
        """Append `tokens` (e.g. a tool's output; padded to a bucket) to slot's row after its
        first `start` cached tokens, and resume sampling there: no re-prefill."""
        n = len(tokens)
        if n < 1 or start + n >= self.cache_length:
            raise ValueError(f"cannot append {n} tokens at {start} (cache {self.cache_length})")
        width = _bucket(n, self.cache_length)
        padded = np.zeros(width, np.int32)
        padded[:n] = tokens
        args = (np.int32(slot), padded, np.int32(n), np.int32(start), sampling, np.int32(max_new))
        return self._append_fn(self.place_params(params), state, *args)

    def deactivate(self, state: DecodeState, slots: list[int]) -> DecodeState:
        mask = np.zeros(self.batch, np.bool_)
        mask[list(slots)] = True
        return self._deactivate_fn(state, mask)

    def prefill_bucket(self, length: int) -> int:
        """Padded prompt width for `length` tokens: a power of two >= 16, capped."""
        return _bucket(length, self._max_prefill + 1, cap=self._max_prefill)


def _bucket(n: int, limit: int, cap: int | None = None) -> int:
    width = 16
    while width < n:
        width *= 2
    width = min(width, cap if cap is not None else limit)
    return max(width, n)
