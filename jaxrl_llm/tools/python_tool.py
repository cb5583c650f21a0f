"""The ToRL code-interpreter tool: run the model's last ```python block, show its output.

Format (ToRL, Li et al. 2025): the model writes

    ```python
    print(2 ** 10)
    ```

and generation stops at "```output" (the stop string stays in the response, so the policy
is trained to ask for the tool); the tool appends the rest of the block, "\\n{result}\\n```\\n".
`result` is stdout for a clean run. For a failed run it is the stdout followed by an error
line: the last line of stderr when it reads as one (e.g. "ZeroDivisionError: division by
zero"), else that line (if any) and "Error: exit code N" (`sys.exit(3)`, a signal, a
message of the program's own on stderr); a timeout reads "TimeoutError: ...". Each part is
truncated ToRL-style: beyond 256 characters keep the first 128, "...", and the last 128.

The program's text cannot end its own block: every run of three or more backticks in
`result` gets a zero-width space (U+200B) between its backticks, so the block's only
"```" is the tool's closing fence. With the policy's tokenizer (`build_tool` passes it),
the tokenizer's special-token strings in `result` are broken the same way
(`tools.special_tokens`), so a program printing "<|im_end|>" adds no end-of-turn token.

`any_code_failed(response)` reads those output blocks back for the reward's code penalty
(a reward sees only text): a block failed when it holds a "Traceback (most recent call
last)" line or its last line looks like "SomethingError: ..." / "Error: ..." /
"SomethingException" / "SystemExit" / "KeyboardInterrupt", which the tool guarantees for
every failed run. So a clean program that itself prints such a line last also counts as
failed (it can only lose reward that way); the rollout, which sees `ExecResult.ok`, can use
that instead when it records per-call results.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from jaxrl_llm.tools.sandbox import resolve_backend, run_python
from jaxrl_llm.tools.sandbox_types import ExecResult, SandboxConfig
from jaxrl_llm.tools.special_tokens import ZERO_WIDTH_SPACE, neutralise_special_tokens

CODE_START = "```python"
OUTPUT_START = "```output"
_FENCE = "```"
_BLOCK = re.compile(r"```python[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_OUTPUT_BLOCK = re.compile(r"```output[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)
_ERROR_LAST_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt)\b(:.*)?$|^\[sandbox\]"
)
_FENCE_RUN = re.compile(r"`{3,}")


def truncate_middle(text: str, limit: int = 256, keep: int = 128) -> str:
    """ToRL's truncation: text longer than `limit` becomes first `keep` + "..." + last `keep`."""
    if len(text) <= limit:
        return text
    return text[:keep] + "..." + text[-keep:]


def last_code_block(text: str) -> str | None:
    """The last ```python block's code (an unclosed final block runs to the end of text)."""
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


def neutralise_fences(text: str) -> str:
    """`text` with a zero-width space between the backticks of each run of three or more,
    so that it holds no "```" to end the output block it is shown in."""
    return _FENCE_RUN.sub(lambda m: ZERO_WIDTH_SPACE.join(m[0]), text)


def error_line(result: ExecResult, *, limit: int = 256, keep: int = 128) -> str:
    """The line(s) ending a failed run's output; the last always matches `_ERROR_LAST_LINE`
    (so `is_error_output` sees the failure however the run failed)."""
    if result.timed_out:
        return "TimeoutError: code execution timed out"
    if result.sandbox_error is not None:
        lines = result.sandbox_error.splitlines() or [""]
        return truncate_middle("SandboxError: " + lines[-1], limit, keep)
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    last = truncate_middle(lines[-1], limit, keep) if lines else ""
    if _ERROR_LAST_LINE.match(last):
        return last
    status = f"Error: exit code {result.exit_code}"
    return f"{last}\n{status}" if last else status


def format_result(
    result: ExecResult, *, limit: int = 256, keep: int = 128, special_tokens: Sequence[str] = ()
) -> str:
    """The text placed inside the output block (see the module docstring); the strings of
    `special_tokens` in it are neutralised (`tools.special_tokens`)."""
    text = truncate_middle(result.stdout.strip("\n"), limit, keep)
    if not result.ok:
        error = error_line(result, limit=limit, keep=keep)
        text = f"{text}\n{error}" if text else error
    return neutralise_fences(neutralise_special_tokens(text, special_tokens))


def format_observation(
    result: ExecResult, *, limit: int = 256, keep: int = 128, special_tokens: Sequence[str] = ()
) -> str:
    """The whole output block: "```output\\n{format_result}\\n```\\n"."""
    body = format_result(result, limit=limit, keep=keep, special_tokens=special_tokens)
    return f"{OUTPUT_START}\n{body}\n{_FENCE}\n"


def output_blocks(response: str) -> list[str]:
    """The contents of every ```output block in a response."""
    return _OUTPUT_BLOCK.findall(response)


def is_error_output(block: str) -> bool:
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    return bool(_TRACEBACK.search(block)) or bool(lines and _ERROR_LAST_LINE.match(lines[-1]))


def any_code_failed(response: str) -> bool:
    """Whether any code execution shown in `response` failed (read from its output blocks)."""
    return any(is_error_output(block) for block in output_blocks(response))


@dataclasses.dataclass
class PythonTool:
    """The `Tool` for ToRL rollouts (`tool(text)`; the samplers call it from their threads).

    `text` is the response so far, ending with the stop string generation stopped on. When
    it ends with "```output" and holds a ```python block with no output yet, the last such
    block runs and the result is the rest of its output block ("\\n{result}\\n```\\n");
    otherwise None (no call: the sample ends).
    """

    config: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
    # The policy tokenizer's special-token strings (`special_tokens.special_token_strings`),
    # neutralised in the program's output; `build_tool` fills them in.
    special_tokens: tuple[str, ...] = ()
    limit: int = 256
    keep: int = 128
    name: str = "python"
    stop_strings: tuple[str, ...] = (OUTPUT_START,)

    def __post_init__(self):
        # Fails closed at construction (before any rollout) when the configured sandbox
        # cannot isolate code here; an explicit "subprocess" is warned about instead.
        resolve_backend(self.config.backend)

    def pending_code(self, text: str) -> str | None:
        """The code `text` (ending in "```output") asks to run, or None."""
        if not text.endswith(OUTPUT_START):
            return None
        text = text[: -len(OUTPUT_START)]
        start = text.rfind(CODE_START)
        if start < 0 or OUTPUT_START in text[start:]:
            return None
        return last_code_block(text[start:])

    def _observation(self, result: ExecResult) -> str:
        block = format_observation(
            result, limit=self.limit, keep=self.keep, special_tokens=self.special_tokens
        )
        return block[len(OUTPUT_START) :]

    def __call__(self, text: str) -> str | None:
        code = self.pending_code(text)
        return None if code is None else self._observation(run_python(code, config=self.config))

    def response_metrics(self, responses: Sequence[str]) -> dict[str, float]:
        """`env/code_success_rate`: the share of output blocks in `responses` that show a
        clean run (`is_error_output`), 0 with no block (`protocol.ReportsMetrics`)."""
        ok = [not is_error_output(b) for r in responses for b in output_blocks(r)]
        return {"env/code_success_rate": float(sum(ok) / len(ok)) if ok else 0.0}
