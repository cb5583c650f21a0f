"""A sample on the host: `LiveSample` while the driver generates it, `Completion` (a stage
record, `types.py`) once done.

`LiveSample` gathers the tokens a slot sampled from the engine's step records (`absorb`)
and searches its current turn for stop strings incrementally (`find_stop`): only the text
of tokens new since the last search, with enough look-back to hold the start of a stop
string they complete; `first_stop` names the match, for both backends. `finished` applies
the JAX driver's finish rules (stop strings, EOS, the whole and the turn's token budget) and
`add_observation` a tool's output before the next turn. `pad_completions`
turns completions into the trainer's [N, T] arrays.

Shapes: N completions, T response tokens (model and inserted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Sequence

import numpy as np

from jaxrl_llm.rollout.records import StepRecords
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.types import Completion

_STOP_CONTEXT = 4  # tokens of look-back per stop-string character


def first_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string whose match in `text` starts first (at one start, the shorter: the
    other extends it), or None. Both backends name a turn's stop string by this rule, which
    `tools.protocol.hands_over` decides on: for a token that completes two at once (the
    "e" of "The" completing "he" and "The") it names the earlier one in the text ("The"),
    where vLLM names the first of its list among matches that end together ("he")."""
    hits = [(text.find(x), len(x), x) for x in stops if x in text]
    return min(hits)[2] if hits else None


@dataclasses.dataclass
class LiveSample:
    """Host-side state of a sample being generated."""

    prompt_index: int
    sample_index: int
    prompt_ids: np.ndarray
    params: SamplingParams
    seed: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    raw: list[float] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    turn_start: int = 0  # index in `tokens` where the current model turn began
    checked: int = 0  # tokens of this turn already searched for stop strings
    tool_calls: int = 0
    turn_end: str = "stop"  # why the turn handed to the tool ended ("stop" | "eos")
    error: str | None = None
    epoch: int = 0  # bumped when the host stops the sample: in-flight tokens are stale
    # The policy version of each token, when the weights may change mid-sample; None: untracked.
    versions: list[int] | None = None

    @property
    def cached(self) -> int:
        return len(self.prompt_ids) + len(self.tokens)

    def absorb(self, rec: StepRecords[np.ndarray], b: int, version: int = 0) -> bool:
        """Append slot b's sampled tokens from host step records [k, B], sampled by policy
        `version`; True if the device finished the sample (EOS, budget or full cache)."""
        valid = rec.valid[:, b]
        raw = rec.raw_logprobs[valid, b].tolist() if self.params.raw_logprobs else None
        self.sampled(rec.tokens[valid, b].tolist(), rec.logprobs[valid, b].tolist(), raw, version)
        return bool(rec.done[:, b].any())

    def sampled(
        self, ids: Sequence[int], logprobs: Sequence[float], raw: Sequence[float] | None = None,
        version: int = 0,
    ) -> None:  # fmt: skip
        """Append tokens the model sampled (mask 1) with their logprobs (`raw` when the
        request asked for them) and the policy version that sampled them."""
        self.tokens.extend(ids)
        self.logprobs.extend(logprobs)
        if raw is not None:
            self.raw.extend(raw)
        self.mask.extend([1] * len(ids))
        if self.versions is not None:
            self.versions.extend([version] * len(ids))

    def insert(self, ids: Sequence[int], version: int = 0) -> None:
        """Append tokens that are not the model's (a tool's output): masked, logprob 0."""
        self.tokens.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        if self.params.raw_logprobs:
            self.raw.extend([0.0] * len(ids))
        self.mask.extend([0] * len(ids))
        if self.versions is not None:
            self.versions.extend([version] * len(ids))

    def cut(self, keep: int) -> None:
        """Drop every token after the first `keep` of the response."""
        for lst in (self.tokens, self.logprobs, self.raw, self.mask, self.versions or []):
            del lst[keep:]

    def find_stop(self, decode: Callable[[Sequence[int]], str]) -> tuple[int, str] | None:
        """(tokens of this turn up to and including the first stop-string match, the stop
        string) or None; `decode` gives token ids' text, special tokens included.

        Incremental: only tokens sampled since the last check are new, so only a window of
        text is decoded: those tokens plus enough before them to hold the start of a stop
        string that they complete (`_STOP_CONTEXT` tokens per character, byte-level tokens
        can be fractions of one)."""
        turn = self.tokens[self.turn_start :]
        stops = self.params.stop
        lo = max(0, self.checked - _STOP_CONTEXT * max(len(x) for x in stops))

        def match(count: int) -> str | None:
            return first_stop(decode(turn[lo:count]), stops)

        if len(turn) <= self.checked or match(len(turn)) is None:
            self.checked = len(turn)
            return None
        first, last = self.checked + 1, len(turn)  # the shortest prefix holding a stop string
        while first < last:
            mid = (first + last) // 2
            if match(mid) is None:
                first = mid + 1
            else:
                last = mid
        stop = match(first)
        assert stop is not None  # the search ends on a prefix that holds one
        return first, stop

    def finished(
        self, device_done: bool, eos_ids: Container[int], decode: Callable[[Sequence[int]], str]
    ) -> tuple[str, str | None] | None:
        """(finish reason, stop string) when the tokens absorbed so far end the turn, else
        None: a stop string (the sample cut right after it), EOS or the whole budget on
        device (`device_done`), or the turn's own budget `max_turn_tokens`, which the host
        cuts as it cuts at a stop string (on device the slot runs on to the whole budget).
        `decode` gives token ids' text, special tokens included."""
        finish = self._natural_finish(device_done, eos_ids, decode)
        cap = self.params.max_turn_tokens
        turn = len(self.tokens) - self.turn_start
        if cap is None or turn < cap or (turn == cap and finish is not None):
            return finish
        self.cut(self.turn_start + cap)
        return "length", None

    def _natural_finish(
        self, device_done: bool, eos_ids: Container[int], decode: Callable[[Sequence[int]], str]
    ) -> tuple[str, str | None] | None:
        """A stop string (the sample cut right after it), EOS or the whole budget."""
        if self.params.stop:
            found = self.find_stop(decode)
            if found is not None:
                count, stop = found
                self.cut(self.turn_start + count)
                return "stop", stop
        if not device_done:
            return None
        return ("eos" if self.tokens and self.tokens[-1] in eos_ids else "length"), None

    def add_observation(
        self, ids: Sequence[int], room: int, version: int = 0
    ) -> tuple[list[int], int, int] | None:
        """Append a tool's observation `ids` (masked), as many as the response budget and
        `room` (the cache positions left) take, and start a new model turn. Returns (the ids
        to feed the engine, the cache position they start at, the tokens left to sample)
        when the whole observation fit with budget to spare, else None: the sample ends
        ("length"). An empty observation feeds the last kept token again."""
        budget = self.params.max_new_tokens - len(self.tokens)
        fit = max(0, min(len(ids), budget, room))
        start = self.cached
        self.insert(ids[:fit], version)
        self.tool_calls += 1
        if fit < len(ids) or fit >= budget:
            return None
        resume = list(ids)
        if not resume:  # nothing appended: recompute the last kept token
            resume, start = [self.tokens[-1]], start - 1
        self.turn_start, self.checked = len(self.tokens), 0
        return resume, start, budget - fit

    def completion(self, reason: str, text: str, stop: str | None = None) -> Completion:
        """The finished record: `reason` one of `types.FINISH_REASONS`, `text` the response's."""
        return Completion(
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
            prompt_ids=self.prompt_ids,
            token_ids=np.asarray(self.tokens, np.int32),
            logprobs=np.asarray(self.logprobs, np.float32),
            raw_logprobs=np.asarray(self.raw, np.float32) if self.params.raw_logprobs else None,
            response_mask=np.asarray(self.mask, np.int32),
            finish_reason=reason,
            text=text,
            stop_string=stop,
            tool_calls=self.tool_calls,
            error=self.error,
            token_versions=None if self.versions is None else np.asarray(self.versions, np.int32),
        )


def pad_completions(
    completions: Sequence[Completion], length: int | None = None, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Right-padded arrays [N, T] for the trainer: response ids, both logprobs (raw ones 0
    where not asked for), the response mask (0 on padding too) and lengths [N]."""
    T = length or max((len(c.token_ids) for c in completions), default=0)
    N = len(completions)
    out = {
        "response_ids": np.full((N, T), pad_id, np.int32),
        "logprobs": np.zeros((N, T), np.float32),
        "raw_logprobs": np.zeros((N, T), np.float32),
        "response_mask": np.zeros((N, T), np.int32),
        "response_lengths": np.zeros(N, np.int32),
    }
    for n, c in enumerate(completions):
        k = min(len(c.token_ids), T)
        out["response_ids"][n, :k] = c.token_ids[:k]
        out["logprobs"][n, :k] = c.logprobs[:k]
        if c.raw_logprobs is not None:
            out["raw_logprobs"][n, :k] = c.raw_logprobs[:k]
        out["response_mask"][n, :k] = c.response_mask[:k]
        out["response_lengths"][n] = k
    return out
