"""A Llama-3.1-like tokenizer and chat template built offline from the shipped tiny one.

Llama 3's control tokens are special *added* tokens (its tokenizer.json marks them special;
Llama-3.1-Instruct's tokenizer_config names only bos and eos, no additional special tokens),
eos is `<|eot_id|>`, and the template follows Meta's Llama 3.1 one in what the agents read:
`Environment: ipython` in the system turn when tools are given, tool calls rendered as the
JSON `{"name": ..., "parameters": ...}` after the assistant header, each tool's answer under
an `ipython` header, and the generation prompt `<|start_header_id|>assistant<|end_header_id|>`
followed by two newlines.
"""

from tokenizers import AddedToken

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer

LLAMA_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- elif m.tool_calls %}{%- set call = m.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    '{{- \'{"name": "\' + call.name + \'", "parameters": \' }}'
    "{{- call.arguments | tojson }}{{- '}<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def llama_tokenizer():
    """The shipped tokenizer with Llama 3.1's control tokens, eos and (stand-in) template."""
    tok = load_tokenizer(builtin_checkpoint())
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA_SPECIALS])
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    tok.chat_template = LLAMA_TEMPLATE
    return tok
