"""Python functions as tools a model calls by name: `FunctionTool` and `ToolBox`.

    def add(a: float, b: float) -> float:
        \"\"\"Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return a + b

    box = ToolBox([FunctionTool(add)], timeout_s=5)
    box.schemas            # JSON schemas, as `apply_chat_template(tools=...)` takes them
    box.answer(turn)       # one `tool` message per call of a `ParsedTurn`, errors included

A tool's schema is read from its signature and Google-style docstring by `transformers`'
`get_json_schema` (what `apply_chat_template(tools=[fn])` does), or given. Arguments are
checked against it with `jsonschema` before the function runs.

Every call ends in a `tool` message, never an exception: an unknown tool, arguments the
schema rejects, a function that raises (also `SystemExit` from a `sys.exit`, or a
`KeyboardInterrupt` it raises itself; the caller's Ctrl-C still stops the run), one that
runs past `timeout_s`, one whose return value JSON cannot write, and a malformed call
(`tool_calls.MalformedCall`) each answer "Error: ..." and count in `metrics()`:
`tools/<name>/{calls,errors,timeouts,latency_s}`, `tools/malformed`, `tools/unknown`.

A call runs in its own daemon thread. Python cannot stop a thread, so a function that hangs
keeps its thread until it returns (the episode goes on without it, and the process can exit);
code that must be killed at its timeout belongs in a subprocess, as the Python sandbox runs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_llm.agents.tool_calls import HasCalls, MalformedCall, ToolCall


@dataclasses.dataclass
class FunctionTool:
    """A Python function the model may call; `schema` defaults to the one `transformers`
    reads from its signature and docstring."""

    fn: Callable[..., Any]
    schema: dict[str, Any] | None = None

    def __post_init__(self):
        import jsonschema

        if self.schema is None:
            from transformers.utils.chat_template_utils import get_json_schema

            self.schema = get_json_schema(self.fn)
        spec = self.schema.get("function", self.schema)
        self.name: str = spec["name"]
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        self._validator = jsonschema.Draft202012Validator(params)

    def check(self, arguments: dict[str, Any]) -> str | None:
        """Why `arguments` do not fit the schema (every reason, sorted), or None."""
        reasons = sorted(
            (".".join(map(str, e.absolute_path)) + ": " if e.absolute_path else "") + e.message
            for e in self._validator.iter_errors(arguments)
        )
        return "; ".join(reasons) or None


def as_text(value: Any) -> str:
    """A tool's return value as the `tool` message's content (JSON unless a string)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


class ToolExit(Exception):
    """A tool's own `BaseException` that is not an `Exception` (`sys.exit` in a CLI wrapper
    or a library, a `KeyboardInterrupt` or `GeneratorExit` it raises): an error of the call,
    not the end of the rollout. The caller's Ctrl-C arrives in the main thread, never here."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _run_with_timeout(fn: Callable[..., Any], kwargs: dict, timeout_s: float) -> Any:
    """`fn(**kwargs)` in a daemon thread; TimeoutError after `timeout_s`; its exception
    (`ToolExit` for one that is not an `Exception`)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(**kwargs)
        except Exception as e:  # handed to the caller
            box["error"] = e
        except BaseException as e:  # raised in the tool's thread: the tool's own
            box["error"] = ToolExit(e)

    thread = threading.Thread(target=target, daemon=True, name="tool-call")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class ToolBox:
    """The tools of an environment: their schemas, running calls, and their metrics."""

    def __init__(self, tools: Sequence[FunctionTool | Callable[..., Any]], *, timeout_s=10.0):
        built = [t if isinstance(t, FunctionTool) else FunctionTool(t) for t in tools]
        self.tools = {t.name: t for t in built}
        if len(self.tools) != len(built):
            raise ValueError(f"two tools share a name: {[t.name for t in built]}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._latency: collections.defaultdict[str, float] = collections.defaultdict(float)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values() if t.schema is not None]

    def _count(self, key: str, latency: float | None = None, name: str = "") -> None:
        with self._lock:
            self._counts[key] += 1
            if latency is not None:
                self._latency[name] += latency

    def call(self, call: ToolCall) -> str:
        """The content of the `tool` message that answers `call`."""
        tool = self.tools.get(call.name)
        if tool is None:
            self._count("unknown")
            return f"Error: unknown tool {call.name!r}; the tools are {', '.join(self.tools)}"
        key = f"{call.name}/"
        self._count(key + "calls")
        problem = tool.check(call.arguments)
        if problem is not None:
            self._count(key + "errors")
            return f"Error: bad arguments for {call.name}: {problem}"
        t0 = time.perf_counter()
        try:
            value = _run_with_timeout(tool.fn, call.arguments, self.timeout_s)
        except TimeoutError as e:
            self._count(key + "timeouts")
            return f"Error: {call.name} timed out ({e})"
        except Exception as e:
            self._count(key + "errors")
            raised = e.error if isinstance(e, ToolExit) else e
            return f"Error: {call.name} raised {type(raised).__name__}: {raised}"
        finally:
            self._count(key + "answered", time.perf_counter() - t0, call.name)
        return self._written(value, key, call.name)

    def _written(self, value: Any, key: str, name: str) -> str:
        """`value` as message text; a value JSON cannot write (an integer past Python's
        int-to-str digit limit, a dict with tuple keys, an object whose `str` raises)
        answers an error instead."""
        try:
            return as_text(value)
        except Exception as e:  # whatever the value's own `__str__` raises, too
            self._count(key + "errors")
            return f"Error: {name} returned a value that cannot be written: {str(e).split(';')[0]}"

    def answer(self, turn: HasCalls) -> list[dict[str, str]]:
        """One `tool` message per call of `turn`, in order, then one per malformed call."""
        messages = [{"role": "tool", "name": c.name, "content": self.call(c)} for c in turn.calls]
        for bad in turn.malformed:
            messages.append({"role": "tool", "name": "error", "content": malformed_text(bad)})
            self._count("malformed")
        return messages

    def metrics(self) -> dict[str, float]:
        """Counts since the last call (`tools/<name>/{calls,errors,timeouts}`, `ran`: the
        calls whose function ran (not refused for their arguments), `latency_s`: their mean
        time; `tools/malformed`, `tools/unknown`), then reset."""
        with self._lock:
            counts, self._counts = self._counts, collections.Counter()
            latency, self._latency = self._latency, collections.defaultdict(float)
        out = {"tools/malformed": float(counts["malformed"])}
        out["tools/unknown"] = float(counts["unknown"])
        for name in self.tools:
            for what in ("calls", "errors", "timeouts"):
                out[f"tools/{name}/{what}"] = float(counts[f"{name}/{what}"])
            ran = counts[f"{name}/answered"]
            out[f"tools/{name}/ran"] = float(ran)
            out[f"tools/{name}/latency_s"] = latency[name] / ran if ran else 0.0
        return out


def malformed_text(bad: MalformedCall) -> str:
    return (
        f"Error: malformed tool call ({bad.reason}); write a JSON object with a name and arguments"
    )


def sum_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Counters from several sources (episodes, hosts) summed; a `.../latency_s` is the mean
    over all the calls that ran (weighted by the matching `.../ran`)."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    total = {k: float(sum(p.get(k, 0.0) for p in parts)) for k in keys}
    for k in [k for k in keys if k.endswith("/latency_s")]:
        calls = [p.get(k[: -len("latency_s")] + "ran", 0.0) for p in parts]
        spent = sum(p.get(k, 0.0) * c for p, c in zip(parts, calls, strict=True))
        total[k] = spent / sum(calls) if sum(calls) else 0.0
    return total
