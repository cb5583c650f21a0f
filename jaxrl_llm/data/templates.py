"""Prompt templates: what text the policy sees for a normalized example.

Templates (``TEMPLATES``):

- ``raw``: the prompt as it is (or, when the row's prompt field holds chat messages, those
  messages up to the last non-assistant turn; a separate ``messages`` column is never used:
  ``data/examples.py``).
- ``chat``: ``raw`` passed through the tokenizer's chat template
  (``tokenizer.apply_chat_template(..., add_generation_prompt=True)``).
- ``torl``: ToRL's tool-integrated-reasoning instruction as the system message and the
  problem as the user message.
- ``search_r1``: Search-R1's instruction with the question appended, as one user message.

A ``system_prompt`` replaces every other system message (the data's, ToRL's) in any template;
``system_prompt=""`` leaves none. (A chat template may still write its own default system
turn when the messages have none, as Qwen2.5's does.)

Every template first builds chat messages; ``render_prompt`` then either applies the tokenizer's
chat template (``use_chat_template=True``, always for ``chat``) or joins the message contents
as plain text, which is how base models are prompted (ToRL and Search-R1 both start from base
models).
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.config_checks import ConfigError

TEMPLATES = ("raw", "chat", "torl", "search_r1")

# ToRL (Li, Zou and Liu 2025, "ToRL: Scaling Tool-Integrated RL", arXiv:2503.23383; code at
# github.com/GAIR-NLP/ToRL): the system prompt of its MATH training data, as in the ToRL recipe
# reproduced by VerlTool (examples/train/torl/math.py), with the problem as the user turn. Code
# goes in ```python blocks and the sandbox's result comes back in an ```output block.
TORL_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. User: Please integrate natural language reasoning with "
    "programs to solve the problem above, and put your final answer within \\boxed{}.:\n"
)

# Search-R1 (Jin et al. 2025, arXiv:2503.09516): the "base" template of
# PeterGriffinJin/Search-R1, scripts/data_process/nq_search.py (make_prefix). That script strips
# the question and appends "?" when missing before filling it in; search_r1_prompt does the same.
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)


def search_r1_prompt(question: str) -> str:
    """Search-R1's user turn for ``question`` (stripped, with a trailing "?" ensured)."""
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return SEARCH_R1_TEMPLATE.format(question=question)


def prompt_messages(
    example: dict[str, Any], template: str, *, system_prompt: str | None = None
) -> list[dict[str, str]]:
    """The chat messages for ``example`` under ``template``.

    Args:
      example: a normalized example (``prompt``; optionally ``messages``, set from the
        prompt field's chat messages by ``data/examples.py``).
      template: one of ``TEMPLATES``.
      system_prompt: a system message to put first, in place of any other (the data's own,
        ToRL's for ``torl``); ``""``: no system message at all; None: the template's own
        (ToRL's for ``torl``, the data's messages as they are, none otherwise).
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; expected one of {TEMPLATES}")
    if template in ("raw", "chat"):
        messages = list(example.get("messages") or [{"role": "user", "content": example["prompt"]}])
    elif template == "torl":
        messages = [
            {"role": "system", "content": TORL_SYSTEM_PROMPT},
            {"role": "user", "content": example["prompt"]},
        ]
    else:
        messages = [{"role": "user", "content": search_r1_prompt(example["prompt"])}]
    if system_prompt is not None:
        messages = [m for m in messages if m["role"] != "system"]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def plain_text(messages: list[dict[str, str]]) -> str:
    """Message contents joined for a model without a chat template (newline between turns)."""
    parts: list[str] = []
    for message in messages:
        if parts and not parts[-1].endswith("\n"):
            parts.append("\n")
        parts.append(message["content"])
    return "".join(parts)


def render_prompt(
    example: dict[str, Any],
    template: str = "raw",
    *,
    tokenizer: Any = None,
    use_chat_template: bool = False,
    system_prompt: str | None = None,
) -> str:
    """The prompt text for ``example``.

    Args:
      example: a normalized example.
      template: one of ``TEMPLATES``; ``chat`` implies ``use_chat_template``.
      tokenizer: a ``transformers`` tokenizer; needed with the chat template.
      use_chat_template: render through ``tokenizer.apply_chat_template`` with a generation
        prompt, instead of joining the message contents.
      system_prompt: optional system message (see ``prompt_messages``).
    """
    messages = prompt_messages(example, template, system_prompt=system_prompt)
    if not (use_chat_template or template == "chat"):
        return plain_text(messages)
    check_chat_template(
        tokenizer, f"template {template!r} (DataConfig.template, eval's --template)"
    )
    return chat_prompt(tokenizer, messages)


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``messages`` through ``tokenizer``'s chat template, ending in a generation prompt, as
    text; the one place that call is made (it checks nothing: ``check_chat_template`` does)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def check_chat_template(tokenizer: Any, chosen: str) -> None:
    """Raise ``ConfigError`` when ``tokenizer`` has no chat template to render through (a base
    model's has none), or one that does not render (a Jinja syntax error, or a template that
    raises on one user turn), naming ``chosen`` (the setting that asked for it) and the
    checkpoint. A template that rendered once is not rendered again (``_RENDERED``)."""
    where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    template = getattr(tokenizer, "chat_template", None)
    if tokenizer is None or not template:
        raise ConfigError(
            f"{chosen} renders prompts through the tokenizer's chat template, and {where} has "
            "none: use 'raw' or 'torl' for a base model, or a checkpoint whose tokenizer has one"
        )
    key = template if isinstance(template, str) else None
    if key is not None and key in _RENDERED:
        return
    import jinja2

    try:
        tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateError as e:
        raise ConfigError(
            f"{chosen}: {where}'s chat template does not render one user turn "
            f"({type(e).__name__}: {e}); fix its chat_template (chat_template.jinja or "
            "tokenizer_config.json), or use a template without it ('raw', 'torl')"
        ) from None
    if key is not None:
        _RENDERED.add(key)


_PROBE = [{"role": "user", "content": "x"}]
_RENDERED: set[str] = set()  # chat templates that rendered `_PROBE`
