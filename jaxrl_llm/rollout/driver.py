"""The RL rollout driver: many prompts x n samples through one `Engine`, with tool turns.

    driver = RolloutDriver(engine, tokenizer)
    completions = driver.generate(prompts, SamplingParams(n=8, stop=("```output",)),
                                  params=train_state.params, tool=python_tool)

- Prompts are prefilled several at a time (`prefill_batch`, as many as the free slots
  take), each inserted into n decode slots, each sample with its own seed
  (`sample_seed(seed, prompt, sample)`), so results do not depend on slot order.
  The n samples share the prompt's full KV pages (`Engine` pages the cache).
- Continuous batching: whenever a slot finishes, its pages go back to the pool and the slot
  is refilled before the next call, when the pool has the pages the next sample reserves
  (its prompt + token budget); otherwise the sample waits until finished ones free pages.
  A prompt's shared pages go back with its last sample, not with the (multi-prompt) prefix.
- Prompts are padded to power-of-two buckets (`Engine.prefill_bucket`), so the number of
  compiles is bounded by the number of buckets, whatever lengths arrive.
- `steps_per_call` decode steps run inside one jitted scan between host checks. The host
  reads call i's records only after dispatching call i + 1, so the device does not wait
  for the host's stop-string search, tool hand-off and refill decisions; a sample the host
  stops ignores what its slot produced in the call already in flight (`LiveSample.epoch`).
  Stop strings are searched incrementally, in the text of the new tokens only.
- Stops: EOS and the token budget on device; stop strings on the host, on decoded text
  (they may span tokens): the sample is cut right after the token that completes the
  first match, and the stop string stays in the output; a token completing several names
  the one that starts first (`completions.first_stop`, the vLLM sampler's rule too).
- Prompts that cannot be generated (empty, too long, an id outside the vocabulary:
  `prompt_checks`, the vLLM sampler's rule too) raise before any compute, or are skipped.
- Tool turns: when a sample stops on one of the tool's stop strings (`tool.stop_strings`;
  any, for a callable without them) and `tool` is given, `tool(text)` runs in a worker
  thread on the response text so far (everything after the prompt, earlier tool outputs
  included), ending at the stop string even when the token that completed it carries more
  text (`protocol.text_for_tool`). It returns the observation text, or None to end the
  sample. Another stop string (the run's own) ends the sample.
  The observation's tokens (`special_tokens.encode_observation`: a tool's text is plain
  text, special-token strings in it included; only a chat template's own markers are
  special) are appended to the sample's cache row (`Engine.append_tokens`, no re-prefill),
  marked 0 in `response_mask`, and sampling resumes in the same slot.
  Other slots keep decoding while a tool runs.
- Partial rollouts (`refresh`): before each device call the driver asks for newer weights;
  the samples still decoding continue with them on the KV they have, later samples start
  with them (prompts prefilled before the swap whose samples wait for a slot are
  prefilled again), and each token records the version that sampled it (`token_versions`).
- `max_new_tokens` bounds the whole response, inserted tokens included (as verl's
  response length); a response that hits it or the cache ends with reason "length".
  `max_turn_tokens` bounds each model turn: a turn that reaches it ends the sample there,
  with reason "length" too (the host cuts it, as at a stop string).

Results come back in order prompt-major: completion `p * n + i` is sample i of prompt p,
so per-group arrays are `x.reshape(-1, n)`.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_llm.rollout.call_state import CallState, Refresh
from jaxrl_llm.rollout.completions import LiveSample
from jaxrl_llm.rollout.completions import pad_completions as pad_completions  # importable here
from jaxrl_llm.rollout.engine import Engine
from jaxrl_llm.rollout.prompt_checks import prompt_problems, refusal
from jaxrl_llm.rollout.records import DecodeState, StepRecords
from jaxrl_llm.rollout.sampling import SamplingParams, SlotSampling, sample_seed
from jaxrl_llm.tools.protocol import ToolCallback, ask, hands_over, text_for_tool, turn_rules
from jaxrl_llm.tools.special_tokens import encode_observation
from jaxrl_llm.types import FINISH_REASONS as FINISH_REASONS  # importable from here too
from jaxrl_llm.types import Completion

log = logging.getLogger(__name__)

_Running = dict[int, tuple[LiveSample, int]]  # slot -> (its sample, the sample's epoch)
DEFAULT_SAMPLING = SamplingParams()


class RolloutDriver:
    """Continuous-batching generation of prompts x n samples on an `Engine`."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any = None,
        *,
        steps_per_call: int = 8,
        max_tool_turns: int = 4,
        tool_workers: int = 4,
        prefill_batch: int = 8,
    ):
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        self.steps_per_call = int(steps_per_call)
        self.max_tool_turns = int(max_tool_turns)
        self.tool_workers = int(tool_workers)
        self.prefill_batch = int(prefill_batch)
        self.eos_ids = {int(i) for i in engine.eos_ids if i >= 0}
        # Prompt ids must index the embedding table (`prompt_checks`); a scripted test
        # engine, which has no model config, is checked for lengths only.
        config = getattr(engine, "config", None)
        self.vocab_size = None if config is None else int(config.vocab_size)
        self.stats: collections.Counter[str] = collections.Counter()

    # -------------------------------------------------------------- helpers
    def encode(self, prompt: str | Sequence[int] | np.ndarray) -> np.ndarray:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer")
            return np.asarray(self.tokenizer(prompt)["input_ids"], np.int32)
        return np.asarray(prompt, np.int32).reshape(-1)

    def _decode(self, ids: Sequence[int], skip_special: bool) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def _decode_all(self, ids: Sequence[int]) -> str:
        return self._decode(ids, skip_special=False)

    def _completion(self, s: LiveSample, reason: str, stop: str | None = None) -> Completion:
        return s.completion(reason, self._decode(s.tokens, skip_special=True), stop)

    # ----------------------------------------------------------------- main
    def generate(
        self,
        prompts: Sequence[str | Sequence[int] | np.ndarray],
        sampling: SamplingParams | Sequence[SamplingParams] = DEFAULT_SAMPLING,
        *,
        params: Any = None,
        tool: ToolCallback | None = None,
        on_long_prompt: str = "raise",
        progress: Callable[[int, int], object] | None = None,
        prompt_indices: Sequence[int] | None = None,
        on_finish: Callable[[int, Completion], object] | None = None,
        refresh: Refresh | None = None,
        version: int = 0,
    ) -> list[Completion]:
        """Complete every prompt `n` times; returns completions prompt-major.

        `params`: the policy params to sample with (the trainer's current params: no copy
        on a shared layout); None uses the engine's own. `sampling`: one SamplingParams for
        all prompts or one per prompt (their `n` may differ; results stay prompt-major).
        `on_long_prompt`, for prompts that cannot be generated (empty, longer than
        `max_prefill_length` or holding an id outside the vocabulary: `prompt_checks`, the
        vLLM sampler's rule too): "raise" (ValueError before any compute) or "skip" (those
        prompts' samples end with finish reason "prompt_too_long", the reason in `error`).
        `progress(done, total)` is called as samples finish (for progress bars; its result
        is ignored).
        `prompt_indices`: each prompt's index for its samples' seeds (default 0, 1, ...);
        a host generating its share of a larger batch passes the global positions, so a
        sample is the same whichever host draws it.
        `on_finish(index, completion)` is called, on this thread, as each sample finishes
        (`index`: its position in the returned list), e.g. to score it while others decode.
        `refresh` (partial rollouts): asked before each device call for newer weights,
        `(params, their version)` or None; running samples continue with them on the KV
        they have (computed with the older weights), and each completion's
        `token_versions` records which version sampled each token (`params` are `version`).
        """
        call = self._start_call(prompts, sampling, tool, on_long_prompt, prompt_indices)
        call.on_finish, call.refresh, call.version = on_finish, refresh, version
        for key in list(call.results):  # samples that ended before any compute
            call.report(key)
        eng = self.engine
        params = eng.place_params(eng.load_params() if params is None else params)
        total = sum(sp.n for sp in call.sampling)
        eng.compile_steps_ahead(params, self.steps_per_call)  # `rollout/ahead.py`
        state = eng.init_decode_state()
        inflight = None  # the last call's records, read after the next call is dispatched
        call.pool = cf.ThreadPoolExecutor(self.tool_workers) if tool is not None else None
        try:
            while True:
                params = self._swap(params, call)
                state = self._resume_tools(params, state, call)
                state = self._admit(params, state, call)
                running: _Running = {b: (s, s.epoch) for b, s in enumerate(call.slots)
                                     if s is not None and b not in call.pending}  # fmt: skip
                dispatched = None
                if running:
                    state, rec = eng.generate_steps(params, state, self.steps_per_call)
                    self.stats["generate_calls"] += 1
                    dispatched = (rec, running, call.version)
                if inflight is not None:
                    state = self._process(state, call, *inflight)
                    if progress is not None:
                        progress(len(call.results), total)
                inflight = dispatched
                if inflight is None and not self._wait_for_tools(call):
                    break
        finally:
            if call.pool is not None:
                call.pool.shutdown(wait=True, cancel_futures=True)
            call.release(eng)  # what an exception left held
        return [call.results[(i, j)] for i, sp in enumerate(call.sampling) for j in range(sp.n)]

    def _start_call(
        self,
        prompts: Sequence[str | Sequence[int] | np.ndarray],
        sampling: SamplingParams | Sequence[SamplingParams],
        tool: ToolCallback | None,
        on_long_prompt: str,
        prompt_indices: Sequence[int] | None,
    ) -> CallState:
        """Check and encode `generate`'s arguments; prompts that cannot be generated
        (`prompt_checks`) end here ("prompt_too_long") or raise, before any compute."""
        if on_long_prompt not in ("raise", "skip"):
            raise ValueError(f"on_long_prompt must be 'raise' or 'skip', got {on_long_prompt!r}")
        if isinstance(sampling, SamplingParams):
            sampling = [sampling] * len(prompts)
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(sampling)} sampling params for {len(prompts)} prompts")
        ids = [self.encode(p) for p in prompts]
        seed_index = list(range(len(ids))) if prompt_indices is None else list(prompt_indices)
        if len(seed_index) != len(ids):
            raise ValueError(f"{len(seed_index)} prompt_indices for {len(ids)} prompts")
        problems = prompt_problems(ids, self.engine.max_prefill_length, self.vocab_size)
        if problems and on_long_prompt == "raise":
            raise refusal(problems)
        batch = self.engine.batch
        queue = collections.deque(i for i in range(len(ids)) if i not in problems)
        free = collections.deque(range(batch))
        call = CallState(ids, list(sampling), seed_index, tool, [None] * batch, free, queue)
        for i, msg in problems.items():
            for j in range(sampling[i].n):
                s = LiveSample(i, j, ids[i], sampling[i], 0, error=msg)
                call.results[(i, j)] = self._completion(s, "prompt_too_long")
        return call

    def _swap(self, params: Any, call: CallState) -> Any:
        """The newer weights `call.refresh` hands over, if any; else `params` (also when no
        sample is left to decode: the push would be wasted)."""
        left = call.queue or call.ready or any(s is not None for s in call.slots)
        newer = call.refresh() if call.refresh is not None and left else None
        if newer is None:
            return params
        params, call.version = newer
        self.stats["weight_swaps"] += 1
        params = self.engine.place_params(params)
        self._reprefill(params, call)
        return params

    def _reprefill(self, params: Any, call: CallState) -> None:
        """Prefill the prompts waiting in `call.ready` again with the new `params` (their
        samples still to insert kept), so that every sample admitted after a swap starts
        from the new weights' prompt KV; the old prefixes' pages go back to the pool."""
        waiting = [(i, todo) for i, _, _, todo in call.ready]
        for _, prefix, row, _ in call.ready:
            self.engine.release_prompt(prefix, row)
        call.ready.clear()
        if waiting:  # at most `prefill_batch` prompts: one prefill holds them all
            self._prefill(params, call, waiting)

    def _wait_for_tools(self, call: CallState) -> bool:
        """Nothing is decoding: wait for a running tool (True) or end the call (False)."""
        if call.pending:
            cf.wait(list(call.pending.values()), return_when=cf.FIRST_COMPLETED)
            return True
        if call.ready:
            raise ValueError(
                f"prompt {call.ready[0][0]}: one sample needs more KV pages than the "
                "whole pool holds; raise num_pages or lower max_new_tokens"
            )
        return False

    def _admit(self, params: Any, state: DecodeState, call: CallState) -> DecodeState:
        """Fill free slots with the next samples while the KV pool has their pages."""
        eng = self.engine
        while call.free and (call.queue or call.ready):
            if not call.ready:
                self._prefill_next(params, call)
            i, prefix, row, todo = call.ready[0]
            sp = call.sampling[i]
            fits = (b for b in call.free if eng.can_insert(prefix, sp.max_new_tokens, row, b))
            slot = next(fits, None)  # a free slot whose shard of the pool has the pages
            if slot is None:
                break  # the pool is full: running samples will free pages
            call.free.remove(slot)
            j = todo.popleft()
            seed = sample_seed(sp.seed, call.seed_index[i], j)
            tracked = [] if call.refresh is not None else None
            call.slots[slot] = LiveSample(i, j, call.ids[i], sp, seed, versions=tracked)
            state = eng.insert_slot(
                prefix, state, slot, SlotSampling.one(sp, seed), sp.max_new_tokens, row
            )
            self.stats["inserts"] += 1
            if not todo:  # its pages go with its samples, not with the (shared) prefix
                call.ready.popleft()
                eng.release_prompt(prefix, row)
        return state

    def _prefill_next(self, params: Any, call: CallState) -> None:
        """Prefill the next prompts in one call: as many as the free slots take (n samples
        each), at most `prefill_batch`."""
        first = call.queue[0]
        count = min(len(call.queue), self.prefill_batch,
                    max(1, -(-len(call.free) // call.sampling[first].n)))  # fmt: skip
        prompts = [call.queue.popleft() for _ in range(count)]
        self._prefill(
            params, call, [(i, collections.deque(range(call.sampling[i].n))) for i in prompts]
        )

    def _prefill(
        self, params: Any, call: CallState, prompts: list[tuple[int, collections.deque[int]]]
    ) -> None:
        """Prefill `prompts` (prompt, its samples to insert) in one call, onto `call.ready`."""
        prefix = self.engine.prefill_many(params, [call.ids[i] for i, _ in prompts])
        self.stats["prefills"] += 1
        call.ready.extend((i, prefix, row, todo) for row, (i, todo) in enumerate(prompts))

    def _process(
        self, state: DecodeState, call: CallState, rec: StepRecords, running: _Running, version: int
    ) -> DecodeState:
        """Absorb one call's records (sampled by policy `version`) into the samples that were
        running when it was dispatched and are unchanged since (`epoch`: a sample stopped or
        resumed after the dispatch ignores the call's tokens); finish or hand samples to the
        tool."""
        host: StepRecords[np.ndarray] = jax.device_get(rec)
        stopped: list[int] = []
        for b, (s, epoch) in running.items():
            if call.slots[b] is not s or s.epoch != epoch:
                continue
            done = s.absorb(host, b, version)
            finish = s.finished(done, self.eos_ids, self._decode_all)
            if finish is None:
                continue
            reason, stop = finish
            s.epoch += 1  # later calls' tokens for this slot are not this sample's
            stopped.append(b)
            if (
                call.tool is not None
                and hands_over(call.tool, reason, stop)
                and s.tool_calls < self.max_tool_turns
            ):
                assert call.pool is not None
                s.turn_end = reason
                text = self._tool_text(s, call.tool, stop)
                call.pending[b] = call.pool.submit(
                    ask, call.tool, s.prompt_index, s.sample_index, text
                )
                continue
            call.finish(s, self._completion(s, reason, stop))
            self._free_slot(b, call)
        if stopped:
            state = self.engine.deactivate(state, stopped)
        return state

    def _tool_text(self, s: LiveSample, tool: ToolCallback, stop: str | None) -> str:
        """The response so far as `tool` reads it, ending at the stop string (`text_for_tool`)."""
        skip = not turn_rules(tool).special_tokens
        turn = self._decode(s.tokens[s.turn_start :], skip) if stop is not None else ""
        return text_for_tool(self._decode(s.tokens, skip), turn, stop)

    def _resume_tools(self, params: Any, state: DecodeState, call: CallState) -> DecodeState:
        """Append finished tool outputs to their samples and resume them, or finish them."""
        eng = self.engine
        for b in [b for b, f in call.pending.items() if f.done()]:
            fut, s = call.pending.pop(b), call.slots[b]
            assert s is not None
            try:
                obs = fut.result()
            except Exception as e:  # a tool failure ends the sample, not the batch
                log.warning("tool failed for prompt %d: %s", s.prompt_index, e)
                s.error, obs = f"tool error: {e}", None
            reason = s.turn_end
            if obs is not None:
                room = eng.cache_length - 1 - s.cached
                resume = s.add_observation(self.encode_observation(obs), room, call.version)
                if resume is not None:
                    ids, start, left = resume
                    # A fresh key stream per turn: positions after a rollback repeat.
                    seed = sample_seed(s.seed, s.tool_calls, 0)
                    state = eng.append_tokens(
                        params, state, b, np.asarray(ids, np.int32), start,
                        SlotSampling.one(s.params, seed), left,
                    )  # fmt: skip
                    self.stats["tool_resumes"] += 1
                    continue
                reason = "length"
            call.finish(s, self._completion(s, reason))
            self._free_slot(b, call)
        return state

    def _free_slot(self, b: int, call: CallState) -> None:
        self.engine.release_slot(b)
        call.slots[b] = None
        call.free.append(b)

    def encode_observation(self, text: str) -> list[int]:
        """The ids appended for a tool's observation, as the vLLM sampler appends them."""
        return encode_observation(self.tokenizer, text)


def generate(
    engine: Engine,
    prompts: Sequence[str | Sequence[int] | np.ndarray],
    sampling: SamplingParams | Sequence[SamplingParams] = DEFAULT_SAMPLING,
    *,
    params: Any = None,
    tool: ToolCallback | None = None,
    tokenizer: Any = None,
    steps_per_call: int = 8,
    on_long_prompt: str = "raise",
) -> list[Completion]:
    """One-shot `RolloutDriver(engine, tokenizer).generate(...)`."""
    driver = RolloutDriver(engine, tokenizer, steps_per_call=steps_per_call)
    return driver.generate(
        prompts, sampling, params=params, tool=tool, on_long_prompt=on_long_prompt
    )
