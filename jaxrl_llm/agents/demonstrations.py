"""Whole episodes as training text: `encode_episode` turns chat messages into the token ids
and loss mask an RL episode of the same conversation has.

    ids, mask = encode_episode(messages, tools, tokenizer)

`messages`: the environment's reset messages (system / user), then model turns
(`assistant`, their text as the model writes it, tool calls included) each followed by the
`tool` messages that answer it (none after the last). The tokens are exactly what
`agents.Episodes` produces on a sampler: the prompt rendered with `tools=` and the
generation prompt, each model turn followed by the end-of-turn token (the tokenizer's EOS),
each observation rendered by the template after it (`ChatFormat.observation`) and encoded
as the samplers encode it (the tools' text plain, the template's markers special). The mask is 1
on the model's tokens (its turns and their end tokens) and 0 on the prompt and observations,
as RL masks them, so supervised fine-tuning on demonstrations trains what RL will sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_llm.agents.chat import ChatFormat
from jaxrl_llm.tools.special_tokens import encode_observation


def encode_episode(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, tokenizer: Any
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = the model's) of one episode (see the module docstring)."""
    first = check_episode(messages, tools)
    chat = ChatFormat(tokenizer)
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])
    prompt = chat.render(list(messages[:first]), generation_prompt=True, tools=list(tools or []))
    ids = encode(prompt)
    mask = [0] * len(ids)
    end = tokenizer.eos_token
    i = first
    while i < len(messages):
        turn = messages[i]  # an assistant turn (`check_episode`)
        model = [*encode(turn["content"]), tokenizer.eos_token_id]
        ids += model
        mask += [1] * len(model)
        j = i + 1
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            rendered = chat.observation(list(messages[i + 1 : j]), end)
            observation = encode_observation(tokenizer, rendered)  # as the samplers append it
            ids += observation
            mask += [0] * len(observation)
        i = j
    return ids, mask


def check_episode(messages: Any, tools: Any = None) -> int:
    """The index of the first assistant turn of an episode `encode_episode` can encode, else a
    `ValueError` saying what is wrong: `messages` a list of `{"role": str, "content": str}`,
    prompt messages first, then assistant turns, each followed by the `tool` messages that
    answer it, the last an assistant turn; `tools` null or a list of JSON schemas."""
    if not isinstance(messages, list | tuple) or not all(
        isinstance(m, Mapping)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError("'messages' must be a list of {'role': str, 'content': str}")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)
    ):
        raise ValueError("'tools' must be a list of JSON schemas (objects), or null")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("an episode needs prompt messages, then at least one assistant turn")
    for i in range(first, len(messages)):
        if messages[i]["role"] not in ("assistant", "tool"):
            role = messages[i]["role"]
            raise ValueError(
                f"message {i}: expected an assistant turn or its tool answers, got {role!r} "
                "(an episode's prompt messages all come before the first assistant turn)"
            )
    if messages[-1]["role"] != "assistant":
        raise ValueError("an episode ends with the model's last turn (an assistant message)")
    return first
