"""Where a jitted step spends its time, by source line: one traced call, per-op self time.

`profile_call(fn, *args)` runs `fn` (a `jax.jit` function) once under `jax.profiler`, reads
the trace's per-op events (XLA:CPU records one per executed thunk: a fusion, a matmul, a
copy, a loop), subtracts nested events (a loop's body ops from the loop) to get each op's
self time, and joins each op to the compiled HLO's metadata: the Python stack frame that
emitted it. Ops are then grouped by the innermost frame's function (`layers.py:MLP.__call__`)
and by kind: `matmul` (the op computes a `dot` or a convolution, fused or not), `copy`
(copies, transposes, bitcasts: layout work) and `other` (elementwise, reductions, gathers).

Used by `jaxrl-llm bench train --profile` to explain where the step's time goes; shares are
of the summed op time, which on XLA:CPU runs ops one after another (a matmul's threads
are inside its op), so they read as shares of the step's wall time.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import tempfile
from pathlib import Path
from typing import Any

SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclasses.dataclass(frozen=True)
class OpProfile:
    """Self time of the traced call's HLO ops, grouped (runtime events that are no HLO op are
    left out). `mapped_share`: the part of that time whose op carries a source line."""

    total_ms: float
    op_events: int  # timed executions of HLO ops (a loop body's ops once per iteration)
    mapped_share: float
    mapped_ops_share: float  # of the timed ops, the fraction with a source line (no timing)
    by_kind: dict[str, float]  # kind -> ms
    by_function: list[tuple[str, str, float]]  # (kind, "file:function", ms), largest first

    def to_json(self, top: int = 20) -> dict[str, Any]:
        share = lambda ms: round(ms / self.total_ms, 4) if self.total_ms else 0.0
        return {
            "total_ms": round(self.total_ms, 1),
            "op_events": self.op_events,
            "mapped_share": round(self.mapped_share, 4),
            "mapped_ops_share": round(self.mapped_ops_share, 4),
            "by_kind": {k: {"ms": round(v, 1), "share": share(v)} for k, v in self.by_kind.items()},
            "by_function": [
                {"kind": k, "function": f, "ms": round(ms, 1), "share": share(ms)}
                for k, f, ms in self.by_function[:top]
            ],
        }


def profile_call(fn: Any, *args: Any) -> OpProfile:
    """Trace one call of the jitted `fn(*args)` (compiled first, so no compile is traced).
    Arguments `fn` donates are consumed, as by any call."""
    import jax

    hlo = fn.lower(*args).compile().as_text()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        with jax.profiler.trace(str(out)):
            jax.block_until_ready(fn(*args))
        traces = sorted(out.glob("plugins/profile/*/*.trace.json.gz"))
        if not traces:
            raise RuntimeError(f"jax.profiler wrote no trace under {out}")
        with gzip.open(traces[-1]) as f:
            events = json.load(f)["traceEvents"]
    return summarise(hlo, events)


def summarise(hlo_text: str, trace_events: list[dict]) -> OpProfile:
    """Group the trace's op self times by the HLO metadata of `hlo_text` (see module doc)."""
    ops = _hlo_ops(hlo_text)
    timed = [e for e in trace_events if e.get("ph") == "X"]
    self_us = _self_times(timed)
    by_kind: dict[str, float] = collections.defaultdict(float)
    by_fn: dict[tuple[str, str], float] = collections.defaultdict(float)
    total = mapped = 0.0
    seen = with_line = 0
    for name, us in self_us.items():
        if name not in ops:
            continue  # runtime bookkeeping (executor, thread pool, Python frames)
        kind, where = ops[name]
        ms = us / 1e3
        total += ms
        mapped += ms if where else 0.0
        seen, with_line = seen + 1, with_line + bool(where)
        by_kind[kind] += ms
        by_fn[(kind, where or "?")] += ms
    return OpProfile(
        total_ms=total,
        op_events=sum(e["name"] in ops for e in timed),
        mapped_share=mapped / total if total else 0.0,
        mapped_ops_share=with_line / seen if seen else 0.0,
        by_kind=dict(by_kind),
        by_function=sorted(((k, f, ms) for (k, f), ms in by_fn.items()), key=lambda r: -r[2]),
    )


def _self_times(events: list[dict]) -> dict[str, float]:
    """Per event name, the summed duration minus that of events nested inside it (same thread)."""
    by_thread: dict[Any, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out: dict[str, float] = collections.defaultdict(float)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, self]
        for e in evs:
            while stack and stack[-1][0] <= e["ts"]:
                _, name, own = stack.pop()
                out[name] += own
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"]])
        for _, name, own in stack:
            out[name] += own
    return out


def _hlo_ops(text: str) -> dict[str, tuple[str, str | None]]:
    """Op name (and its GPU kernel's name) -> (kind, "file:function" of its innermost
    recorded stack frame or None)."""
    frames = _frames(text)
    computations = _computation_bodies(text)
    ops = {}
    pattern = r"^\s*(?:ROOT )?%([\w.\-]+) = .*$"
    for m in re.finditer(pattern, text, re.M):
        frame = re.search(r"stack_frame_id=(\d+)", m.group(0))
        where = frames.get(int(frame.group(1))) if frame else None
        ops[m.group(1)] = (_kind(m.group(1), m.group(0), computations), where)
    # XLA:GPU names an op's kernel with '_' for the '.' of its HLO name (input_reduce_fusion.118
    # runs as input_reduce_fusion_118; seen on an H200, JAX 0.11.2).
    kernels = {name.replace(".", "_"): op for name, op in ops.items()}
    return kernels | ops


def _kind(name: str, line: str, computations: dict[str, str]) -> str:
    called = re.search(r"calls=%([\w.\-]+)", line)
    body = computations.get(called.group(1), "") if called else ""
    if re.search(r" (dot|convolution)\(", line) or re.search(r" (dot|convolution)\(", body):
        return "matmul"
    if name.startswith(("copy", "transpose", "bitcast")):
        return "copy"
    return "other"


def _computation_bodies(text: str) -> dict[str, str]:
    """Computation name -> its body text (fusions' `calls=` targets)."""
    bodies = {}
    for m in re.finditer(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", text, re.M | re.S):
        bodies[m.group(1)] = m.group(2)
    return bodies


def _frames(text: str) -> dict[int, str]:
    """Stack frame id -> "file:function" of that frame, from the HLO text's frame tables
    (`parent_frame_id` is printed 1-based; 0 is the root)."""
    table = {}
    for section in SECTIONS:
        m = re.search(rf"^{section}\n((?:\d+ .*\n?)+)", text, re.M)
        lines = m.group(1).splitlines() if m else []
        table[section] = {int(k): v for k, v in (ln.split(" ", 1) for ln in lines)}
    files = {k: _short(v.strip('"')) for k, v in table["FileNames"].items()}
    funcs = {k: v.strip('"') for k, v in table["FunctionNames"].items()}
    where = {}
    for k, v in table["FileLocations"].items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        where[k] = f"{files[int(f['file_name_id'])]}:{funcs[int(f['function_name_id'])]}"
    out = {}
    for k, v in table["StackFrames"].items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        out[k] = where[int(f["file_location_id"])]
    return out


def _short(path: str) -> str:
    """A source path relative to its package root (site-packages or this project)."""
    for marker in ("site-packages/", "/jaxrl_llm/"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail if marker == "site-packages/" else f"jaxrl_llm/{tail}"
    return Path(path).name
