"""Which prompts a sampler generates: one rule for both backends (the JAX driver and vLLM),
so that they refuse the same prompts in the same words.

A prompt of token ids [P] cannot be generated when it is empty, longer than the sampler's
`max_prefill_length`, or holds an id outside the vocabulary [0, V): the JAX engine's
embedding lookup has no row for it (an id >= V embeds as NaN, a negative one wraps to the
last row), and vLLM refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

_SHOWN = 5  # problems named in an error; the count says how many there are


def prompt_problem(ids: np.ndarray, max_length: int | None, vocab_size: int | None) -> str | None:
    """Why the prompt `ids` [P] cannot be generated, or None when it can; `max_length` None
    leaves the length to the caller (the server counts the BOS it adds), `vocab_size` None
    (an engine without a model config) checks lengths only."""
    if len(ids) == 0:
        return "empty prompt"
    if max_length is not None and len(ids) > max_length:
        return f"prompt of {len(ids)} tokens exceeds max_prefill_length {max_length}"
    if vocab_size is not None:
        outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        if len(outside):
            at = int(outside[0])
            return (
                f"token id {int(ids[at])} at position {at} is outside the vocabulary "
                f"[0, {vocab_size}) (prompt ids from another tokenizer?)"
            )
    return None


def prompt_problems(
    prompts: Sequence[np.ndarray], max_length: int, vocab_size: int | None
) -> dict[int, str]:
    """{prompt index: why it cannot be generated} for the prompts that cannot."""
    found = ((i, prompt_problem(p, max_length, vocab_size)) for i, p in enumerate(prompts))
    return {i: msg for i, msg in found if msg is not None}


def refusal(problems: Mapping[int, str]) -> ValueError:
    """The error that refuses a call holding the prompts `problems` names."""
    shown = "; ".join(f"prompt {i}: {msg}" for i, msg in list(problems.items())[:_SHOWN])
    return ValueError(f"{len(problems)} prompt(s) cannot be generated: {shown}")
