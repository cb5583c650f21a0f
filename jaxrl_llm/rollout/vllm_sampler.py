"""The vLLM sampler backend: an in-process `vllm.LLM` on the policy's checkpoint folder.

    RolloutConfig.backend = "vllm"      # settings: VllmConfig (rollout/config.py)

- **Weights.** `push_weights` turns the trainer's State into Hugging Face tensors
  (`models.hf_io.hf_tensors`; LoRA adapters merged into the base first: vLLM gets whole
  weights, never an adapter) and loads them into vLLM's model in memory with its model
  runner's `reload_weights` (through `LLM.collective_rpc`; no checkpoint is written; on
  CPU a tied output head is re-packed after, `_repack_lm_head`), then empties the prefix
  cache, whose KV was computed with the old weights. `policy_version` is the version of
  the last push that completed (None while one loads, and after one that raised): vLLM's
  loader takes the model's own tensors only, so the version cannot ride in them as it does
  on the JAX engine, but no part of an update is pushed apart either (adapters merged).
- **Samples.** Each sample is its own request with its own seed (`sample_seed(seed,
  prompt, sample)`, as the JAX engine), n requests per prompt sharing the prompt through
  prefix caching. vLLM returns the logprob of each sampled token under the distribution it
  sampled from (`logprobs_mode="processed_logprobs"`); greedy samples get 0, as on the JAX
  engine. Finish reasons map to ours: EOS / a stop token id -> "eos", a stop string ->
  "stop" (the string kept, `include_stop_str_in_output`), the token budget -> "length".
  The stop string is named by the driver's rule (`completions.first_stop` on the turn's
  text: the match that starts first), not vLLM's (the match that ends first, the first of
  its list among those ending together), so that a tool's hand-over is decided alike.
  The response text is decoded from the tokens by our tokenizer, as the JAX driver does.
  Prompts are refused by the driver's rule and words (`prompt_checks`).
- **Tool turns.** A sample that stops on a tool's stop string hands its response text, ending
  at the stop string (`protocol.text_for_tool`), to the tool in a worker thread while vLLM
  goes on decoding the others (a stop string of the run's own ends the sample); the
  observation's tokens (`special_tokens.encode_observation`, as the JAX driver encodes
  them: a tool's text is plain text) are appended (response mask 0, logprob 0) and the
  sample continues as a new request of prompt + response so far (a prefix-cache hit), with
  the budget left and a fresh seed per turn: the same tokens, masks and budgets as
  `rollout/driver.py`.
- **Partial rollouts** (`refresh`, `RLConfig.partial_rollouts`): requests stream each step's
  new tokens; when newer weights arrive between two engine steps, the live requests are
  aborted, the weights pushed (the prefix cache emptied) and each sample re-submitted as
  prompt + response so far, with what is left of its budgets and a fresh seed stream: its KV
  is recomputed with the new weights (the JAX engine keeps the old KV instead), and each
  token records the version that sampled it. A stop string split across a swap (begun
  before, completed after), which vLLM cannot see in the new request's own text, is found
  by searching the turn on the host, as the JAX driver does.
- **Engine.** Importing vLLM, starting it and loading weights into it: `vllm_engine.py`.
- **Processes.** vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before
  vLLM is imported unless the environment says otherwise): weights pass by reference, no
  spawned engine process. Its logs go to stderr (`VLLM_LOGGING_STREAM`).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.rollout.completions import LiveSample, first_stop
from jaxrl_llm.rollout.config import VllmConfig
from jaxrl_llm.rollout.prompt_checks import prompt_problems, refusal
from jaxrl_llm.rollout.sampler import (
    OnFinish,
    Progress,
    Refresh,
    SamplerContext,
    ToolCallback,
    WeightPush,
    check_version,
)
from jaxrl_llm.rollout.sampling import SamplingParams, sample_seed
from jaxrl_llm.rollout.vllm_engine import (
    check_temperature,
    cpu_engine_args,
    import_vllm,
    load_weights,
    new_llm,
)
from jaxrl_llm.tools.protocol import ask, hands_over, text_for_tool, turn_rules
from jaxrl_llm.tools.special_tokens import encode_observation
from jaxrl_llm.types import Completion

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Call:
    """One `generate` call's host state."""

    sampling: SamplingParams
    tool: ToolCallback | None
    total: int
    live: dict[str, LiveSample] = dataclasses.field(default_factory=dict)  # request -> sample
    pending: dict[cf.Future, LiveSample] = dataclasses.field(default_factory=dict)  # tool turns
    results: dict[int, Completion] = dataclasses.field(default_factory=dict)
    pool: cf.ThreadPoolExecutor | None = None
    on_finish: OnFinish | None = None
    progress: Progress | None = None
    refresh: Refresh | None = None  # partial rollouts: newer weights, between engine steps
    version: int = 0  # of the weights the live requests sample with (tracked with `refresh`)
    swaps: int = 0

    def finish(self, s: LiveSample, completion: Completion) -> None:
        index = s.prompt_index * self.sampling.n + s.sample_index  # prompt-major
        self.results[index] = completion
        if self.on_finish is not None:
            self.on_finish(index, completion)
        if self.progress is not None:
            self.progress(len(self.results), self.total)


class VllmSampler:
    """`Sampler` on an in-process `vllm.LLM` (see the module docstring)."""

    policy_version: int | None = None  # the weights' version, as their push delivered it

    def __init__(self, ctx: SamplerContext, cfg: VllmConfig | None = None):
        from flax import nnx

        if ctx.cfg.weights != "same":
            raise ConfigError(
                f"rollout.weights = {ctx.cfg.weights!r} quantises our JAX engine's copy; vLLM "
                "loads and quantises its own (its `quantization` option): use "
                "rollout.weights = 'same' with rollout.backend = 'vllm'"
            )
        if ctx.cfg.kv_cache_dtype != "auto":
            raise ConfigError(
                f"rollout.kv_cache_dtype = {ctx.cfg.kv_cache_dtype!r} sets our JAX engine's KV "
                "cache; vLLM keeps its own: use rollout.kv_cache_dtype = 'auto' with "
                "rollout.backend = 'vllm', and VllmConfig.kv_cache_dtype (e.g. 'fp8')"
            )
        check_temperature(ctx.cfg.temperature, "rollout.temperature")  # before vLLM starts
        check_temperature(ctx.cfg.val_temperature, "rollout.val_temperature")
        vllm = import_vllm()
        from vllm.platforms import current_platform

        if ctx.checkpoint is None:
            raise ConfigError("rollout.backend = 'vllm' loads the policy's checkpoint folder")
        if ctx.sampling_mesh is not None:
            raise ConfigError(
                "MeshConfig.rollout_devices sets JAX devices apart for our engine; vLLM places "
                "itself (its own devices and parallelism): use rollout_devices = 0 with it"
            )
        v = cfg or VllmConfig()
        r = ctx.cfg
        cpu = current_platform.is_cpu()
        auto = ctx.rollout_dtype or ("float32" if cpu else "bfloat16")  # PolicyConfig's first
        dtype = v.dtype if v.dtype != "auto" else auto
        self.max_model_len = ctx.max_prompt_length + r.max_new_tokens + 1
        self.max_prompt_length = ctx.max_prompt_length
        self.max_tool_turns = r.max_tool_calls
        self.tool_workers = r.tool_workers
        self.tokenizer = ctx.tokenizer
        self.dtype = dtype
        # The JAX engine's stop tokens (config, generation config and the chat template's
        # end of turn: `models.stop_tokens`); vLLM alone would stop on the first two only.
        self.stop_token_ids = sorted({int(i) for i in ctx.policy.config.eos_token_ids if i >= 0})
        self.vocab_size = int(ctx.policy.config.vocab_size)
        self._graphdef = nnx.graphdef(ctx.policy)
        self._ids = itertools.count()
        self.stats: collections.Counter[str] = collections.Counter()
        t0 = time.perf_counter()
        self.llm = new_llm(
            vllm,
            model=str(ctx.checkpoint),
            dtype=dtype,
            seed=0,
            max_model_len=self.max_model_len,
            max_num_seqs=v.max_num_seqs,
            enable_prefix_caching=v.prefix_caching,
            kv_cache_dtype=v.kv_cache_dtype,
            gpu_memory_utilization=v.gpu_memory_utilization,
            tensor_parallel_size=v.tensor_parallel_size,
            enforce_eager=v.enforce_eager,
            logprobs_mode="processed_logprobs",
            max_logprobs=1,
            **(cpu_engine_args(v, self.max_model_len) if cpu else {}),
        )
        took = time.perf_counter() - t0
        log.info("vLLM %s (%s) started in %.1f s", vllm.__version__, dtype, took)

    # ------------------------------------------------------------ weights
    def push_weights(self, params: Any, version: int | None = None) -> WeightPush:
        from flax import nnx

        self.policy_version = None  # a load that raises leaves vLLM's weights half old
        push = load_weights(self.llm, nnx.merge(self._graphdef, params), self.dtype)
        self.policy_version = version
        self.stats["weight_pushes"] += 1
        return push

    # ----------------------------------------------------------- sampling
    def generate(
        self,
        prompts: Sequence[np.ndarray],
        sampling: SamplingParams,
        *,
        tool: ToolCallback | None = None,
        prompt_indices: Sequence[int] | None = None,
        on_finish: OnFinish | None = None,
        progress: Progress | None = None,
        refresh: Refresh | None = None,
    ) -> list[Completion]:
        ids = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
        where = list(range(len(ids))) if prompt_indices is None else list(prompt_indices)
        if len(where) != len(ids):
            raise ValueError(f"{len(where)} prompt_indices for {len(ids)} prompts")
        self._check_prompts(ids)
        if sampling.raw_logprobs:
            raise ValueError("the vllm backend returns the sampled distribution's logprobs only")
        check_temperature(sampling.temperature, "the sampling temperature")
        n = sampling.n
        call = _Call(sampling, tool, len(ids) * n, on_finish=on_finish, progress=progress,
                     refresh=refresh, version=self.policy_version or 0)  # fmt: skip
        engine = self.llm.llm_engine
        call.pool = cf.ThreadPoolExecutor(self.tool_workers) if tool is not None else None
        tracked = lambda: [] if refresh is not None else None
        try:
            for p, j in itertools.product(range(len(ids)), range(n)):
                seed = sample_seed(sampling.seed, where[p], j)
                sample = LiveSample(p, j, ids[p], sampling, seed, versions=tracked())
                self._submit(call, sample, seed)
            while call.live or call.pending:
                self._swap(call)
                if engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.request_id in call.live:
                            self._step_output(call, out)
                elif call.pending:
                    cf.wait(list(call.pending), return_when=cf.FIRST_COMPLETED)
                self._resume_tools(call)
        finally:
            if call.live:  # an error above: leave no request behind in the engine
                engine.abort_request(list(call.live))
            if call.pool is not None:
                call.pool.shutdown(wait=True, cancel_futures=True)
        return [call.results[i] for i in range(call.total)]

    def _check_prompts(self, ids: list[np.ndarray]) -> None:
        """Refuse the call, before any request, as the JAX driver does (`prompt_checks`)."""
        problems = prompt_problems(ids, self.max_prompt_length, self.vocab_size)
        if problems:
            raise refusal(problems)

    def _submit(self, call: _Call, s: LiveSample, seed: int) -> None:
        """One turn of `s` as a request: its prompt and response so far, the budget left."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = call.sampling
        params = VllmSamplingParams(
            n=1,
            temperature=sp.temperature,
            top_k=sp.top_k,
            top_p=sp.top_p,
            max_tokens=_turn_budget(sp, len(s.tokens), len(s.tokens) - s.turn_start),
            seed=seed,
            stop=list(sp.stop) or None,
            stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=True,
            skip_special_tokens=False,  # stop strings are searched as the JAX driver does
            logprobs=0,  # the sampled token's only
            # One output per request, when done; with partial rollouts each step's new
            # tokens, so a swap knows what each request has sampled so far.
            output_kind=RequestOutputKind.DELTA if call.refresh else RequestOutputKind.FINAL_ONLY,
        )
        request = str(next(self._ids))
        prompt = {"prompt_token_ids": [*s.prompt_ids.tolist(), *s.tokens]}
        self.llm.llm_engine.add_request(request, prompt, params)
        call.live[request] = s
        self.stats["requests"] += 1

    def _absorb(self, call: _Call, s: LiveSample, out: Any) -> None:
        """Append a request's output tokens (all of them, or with partial rollouts the step's
        new ones) to its sample, tagged with the version of the weights that sampled them."""
        greedy = call.sampling.temperature <= 0
        tokens = list(out.token_ids)
        logprobs = [
            0.0 if greedy else float(lps[t].logprob)
            for t, lps in zip(tokens, out.logprobs or [{}] * len(tokens), strict=True)
        ]
        s.sampled(tokens, logprobs, version=call.version)

    def _swap(self, call: _Call) -> None:
        """Partial rollouts: when `call.refresh` hands over newer weights, abort the live
        requests (what they sampled is absorbed already), push the weights (which empties
        the prefix cache) and re-submit each sample as prompt + response so far: its KV is
        computed again with the new weights, and it samples on with a fresh seed stream."""
        if call.refresh is None or not (call.live or call.pending):
            return
        newer = call.refresh()
        if newer is None:
            return
        running = list(call.live.values())
        if call.live:
            self.llm.llm_engine.abort_request(list(call.live))
            call.live.clear()
        self.push_weights(newer.params, newer.version)
        check_version(self.policy_version, newer.version)
        call.version, call.swaps = newer.version, call.swaps + 1
        self.stats["weight_swaps"] += 1
        for s in running:
            self._submit(call, s, sample_seed(s.seed, s.tool_calls, call.swaps))

    def _step_output(self, call: _Call, out: Any) -> None:
        """One request's output of an engine step: absorb its tokens; at its end, or (with
        partial rollouts) at a stop string that a swap's re-submission split and vLLM, which
        searches each request's own text, cannot see, end the turn."""
        s = call.live[out.request_id]
        self._absorb(call, s, out.outputs[0])
        if out.finished:
            del call.live[out.request_id]
            reason, stop = _finish_reason(out.outputs[0])
            if stop is not None:  # named as the driver names it, from the turn's own text
                stop = first_stop(self._text(s, True, s.turn_start), s.params.stop) or stop
            self._end_turn(call, s, reason, stop)
        elif call.swaps and s.params.stop:
            found = s.find_stop(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False))
            if found is not None:  # searched as the JAX driver does; cut right after it
                self.llm.llm_engine.abort_request([out.request_id])
                del call.live[out.request_id]
                s.cut(s.turn_start + found[0])
                self._end_turn(call, s, "stop", found[1])

    def _end_turn(self, call: _Call, s: LiveSample, reason: str, stop: str | None) -> None:
        """A turn ended (its tokens absorbed): finish the sample or hand it to the tool."""
        if (
            call.tool is not None
            and hands_over(call.tool, reason, stop)
            and s.tool_calls < self.max_tool_turns
        ):
            assert call.pool is not None
            s.turn_end = reason
            special = turn_rules(call.tool).special_tokens
            turn = self._text(s, special, s.turn_start) if stop is not None else ""
            text = text_for_tool(self._text(s, special), turn, stop)
            call.pending[call.pool.submit(ask, call.tool, s.prompt_index, s.sample_index, text)] = s
            return
        call.finish(s, s.completion(reason, self._text(s), stop))

    def _resume_tools(self, call: _Call) -> None:
        """Append finished tool outputs and continue their samples, or finish them."""
        for fut in [f for f in call.pending if f.done()]:
            s = call.pending.pop(fut)
            try:
                obs = fut.result()
            except Exception as e:  # a tool failure ends the sample, not the batch
                log.warning("tool failed for prompt %d: %s", s.prompt_index, e)
                s.error, obs = f"tool error: {e}", None
            if obs is None:
                call.finish(s, s.completion(s.turn_end, self._text(s)))
                continue
            obs_ids = encode_observation(self.tokenizer, obs)
            budget = s.params.max_new_tokens - len(s.tokens)
            fit = max(0, min(len(obs_ids), budget))
            s.insert(obs_ids[:fit], call.version)
            s.tool_calls += 1
            s.turn_start = len(s.tokens)
            if fit == len(obs_ids) and fit < budget:  # room for the output and more
                self._submit(call, s, sample_seed(s.seed, s.tool_calls, 0))
                self.stats["tool_resumes"] += 1
            else:
                call.finish(s, s.completion("length", self._text(s)))

    def _text(self, s: LiveSample, special_tokens: bool = False, start: int = 0) -> str:
        """The text of the response's tokens from `start` on."""
        return self.tokenizer.decode(s.tokens[start:], skip_special_tokens=not special_tokens)

    def metrics(self) -> dict[str, float]:
        stats, self.stats = self.stats, collections.Counter()
        return {f"rollout/vllm/{k}": float(v) for k, v in sorted(stats.items())}

    def release(self) -> None:
        """Nothing to drop: vLLM's weights are its own copy, replaced by the next push."""

    def close(self) -> None:
        self.policy_version = None
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            import gc

            gc.collect()


def _finish_reason(out: Any) -> tuple[str, str | None]:
    """Ours from vLLM's: ("eos" | "stop" | "length", the stop string as vLLM names it)."""
    if out.finish_reason == "length":
        return "length", None
    if out.finish_reason == "stop":
        if isinstance(out.stop_reason, str):
            return "stop", out.stop_reason
        return "eos", None  # the EOS token or a stop token id
    raise RuntimeError(f"vLLM ended a request with {out.finish_reason!r}")


def build(ctx: SamplerContext) -> VllmSampler:
    return VllmSampler(ctx)


def _turn_budget(sp: SamplingParams, used: int, in_turn: int = 0) -> int:
    """Tokens the next request may generate: what is left of the response's budget (`used`
    tokens so far), at most what is left of `max_turn_tokens` (`in_turn` of the current
    turn so far; a turn that reaches it ends with reason "length", as on the driver)."""
    left = sp.max_new_tokens - used
    return left if sp.max_turn_tokens is None else min(left, sp.max_turn_tokens - in_turn)
