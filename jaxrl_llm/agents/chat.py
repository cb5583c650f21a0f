"""Tool calls in the checkpoint's own chat format, as a rollout tool: `ChatToolUse`.

    tool = ChatToolUse(ToolBox([add, convert]), tokenizer, fmt="qwen")
    sampler.generate(prompts, sampling, tool=tool)      # any backend behind the seam

A model turn ends with the chat template's end-of-turn token (Qwen's `<|im_end|>`, Llama's
`<|eot_id|>`, or another of the engine's stop tokens: Llama 3.1's `<|eom_id|>` after a tool
call), so a chat tool sets `turn_ends_on_eos` and the
sampler hands it each sample that stops there (`tools.protocol.turn_rules`), with special
tokens kept. `ChatToolUse` reads the turn's calls with the format's parser
(`tool_calls.PARSERS`), answers every call through the `ToolBox` (several per turn; errors
and malformed calls answered too), and returns the template's own rendering of those `tool`
messages up to the next assistant header; the sampler appends it token-exact (masked out of
the loss) and the model continues. A turn with no call is the final answer: None, and the
sample ends as "eos". Stateful episodes (an environment per sample) are `agents.Episodes`.

`ChatFormat` owns the template arithmetic both use. The observation is what
`apply_chat_template` renders after an assistant turn when the `tool` messages follow it,
with `add_generation_prompt=True`, less the end-of-turn token the model already wrote (or
the template's end of turn, the tokenizer's eos, where the model ended with another stop
token: after Llama 3.1's `<|eom_id|>` the `ipython` header follows at once, as in Meta's
format): for
Qwen2.5 `\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
<|im_start|>assistant\\n`. It is read from the template with a placeholder turn, so any
template that renders `tool` messages works unchanged. It is an `Observation`: the template's
markers keep their special tokens, while a special token's string in the messages (a tool's
result, a name) is plain text when the sampler encodes it (`tools.special_tokens`), so a
result that holds "<|im_end|>\\n<|im_start|>assistant" ends no turn and forges none.

The turn's text is the model's text: every special token is removed from it, named or not
(Llama 3's tokenizer names only bos and eos; `<|python_tag|>`, `<|eom_id|>` and the headers
are special added tokens), except the markup the parsers read (`tool_calls.PARSER_MARKUP`:
`<think>`, `</think>`, `<tool_call>`, `</tool_call>`), so the parser can leave the calls
drafted in the reasoning unrun (`tool_calls.split_reasoning`). `opens_reasoning`: the
generation prompt ends with `<think>` (Qwen3-Thinking-2507, DeepSeek-R1), so the turn's text
up to its first `</think>` is reasoning.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.agents.functions import ToolBox
from jaxrl_llm.agents.tool_calls import PARSER_MARKUP, THINK_OPEN, ParsedTurn, parse_turn
from jaxrl_llm.tools.special_tokens import Observation, mark_special_tokens, special_token_strings

_PLACEHOLDER = "\u2063turn\u2063"  # text no template rewrites


class ChatFormat:
    """Turns of a response and observations, in a tokenizer's chat template."""

    def __init__(self, tokenizer: Any, fmt: str = "qwen"):
        parse_turn(fmt, "")  # an unknown format fails here, at start-up
        self.tokenizer, self.fmt = tokenizer, fmt
        user = [{"role": "user", "content": "u"}]
        prompt = self.render(user, generation_prompt=False)
        self.generation_prompt = self.render(user, generation_prompt=True)[len(prompt) :]
        if not self.generation_prompt:
            raise ValueError("the chat template adds no generation prompt: cannot find turns")
        self.opens_reasoning = self.generation_prompt.rstrip().endswith(THINK_OPEN)
        # Every special token, named or not (Llama 3 names only bos and eos: <|eom_id|>,
        # <|python_tag|> and the headers are special added tokens), less the markup the
        # parsers read.
        self.plain_specials = special_token_strings(tokenizer)  # plain in observations
        specials = {tokenizer.eos_token, *self.plain_specials} - {None, "", *PARSER_MARKUP}
        self.special_tokens = sorted(specials, key=len, reverse=True)

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool, tools=None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def last_turn(self, text: str) -> tuple[str, str]:
        """(The last model turn of a response decoded with special tokens kept, as the model's
        text: special tokens removed; the special token that ended it, or ""). The turn
        starts after the last generation prompt: every observation ends with one."""
        turn = text.rsplit(self.generation_prompt, 1)[-1]
        end = next((t for t in self.special_tokens if turn.endswith(t)), "")
        turn = turn[: len(turn) - len(end)]
        for t in self.special_tokens:
            turn = turn.replace(t, "")
        return turn, end

    def parse(self, text: str) -> tuple[str, ParsedTurn, str]:
        """The last turn's text (`last_turn`), its calls (the format's parser), its end."""
        turn, end = self.last_turn(text)
        return turn, parse_turn(self.fmt, turn, prompt_opens_reasoning=self.opens_reasoning), end

    def observation(self, messages: list[dict[str, Any]], end: str = "") -> Observation:
        """The template's text for `messages` (`tool` messages) after an assistant turn, up
        to and with the next generation prompt, less the end of turn that the turn's end
        token `end` wrote or stands for (see the module docstring); the special
        tokens' strings in the messages are plain parts (see the module docstring)."""
        chat = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PLACEHOLDER},
            *mark_special_tokens(messages, self.plain_specials),
        ]
        text = self.render(chat, generation_prompt=True)
        after = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
        # The model's end token is the template's end of turn or stands for it (Llama 3.1's
        # <|eom_id|> before a tool's answer, where the template writes <|eot_id|>).
        if end:
            eos = self.tokenizer.eos_token
            drop = next((t for t in (end, eos) if t and after.startswith(t)), "")
            after = after[len(drop) :]
        return Observation.from_marked(after, self.plain_specials)


class ChatToolUse:
    """The rollout `Tool` for chat-format tool calling (see the module docstring)."""

    name = "chat_tools"
    stop_strings: tuple[str, ...] = ()
    turn_ends_on_eos = True
    sees_special_tokens = True

    def __init__(self, toolbox: ToolBox, tokenizer: Any, *, fmt: str = "qwen"):
        self.toolbox = toolbox
        self.chat = ChatFormat(tokenizer, fmt)

    def __call__(self, text: str) -> str | None:
        _, parsed, end = self.chat.parse(text)
        if not parsed.calls and not parsed.malformed:
            return None
        return self.chat.observation(self.toolbox.answer(parsed), end)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, for `apply_chat_template(..., tools=schemas)`."""
        return self.toolbox.schemas

    def metrics(self) -> dict[str, float]:
        return self.toolbox.metrics()

    def close(self) -> None:
        """Nothing held: each call's thread ends with its call."""
