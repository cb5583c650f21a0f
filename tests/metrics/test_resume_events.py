"""A resumed run's TensorBoard events: each step once, with the resumed run's value.

Read here as TensorBoard's Python loader (`plugin_event_accumulator.EventAccumulator`,
behind `tensorboard --load_fast=false`) reads a run folder: event files in name order, and
a `SessionLog.START` event at step s (file_version brain.Event:2) discards every event at a
step >= s read before it, of every tag in the folder. TensorBoard's default loader (the
Rust data server) needs no START: a record at step s preempts its own series' records at
steps >= s read before it; `view(..., rust=True)` reads that way.
"""

from __future__ import annotations

import struct
import types
from collections import defaultdict

import pytest

from jaxrl_llm.metrics.generations import GenerationLog
from jaxrl_llm.metrics.writer import MetricsConfig, MetricsWriter, read_metrics
from tests.metrics.test_generations import rollout, tokenizer  # noqa: F401  (fixture)

TB = MetricsConfig(tensorboard=True)


@pytest.fixture
def clock(monkeypatch):
    """tensorboardX's clock (it names event files by the second): `clock.now` is set by
    the test, so a resumed session's files are named later without sleeping."""
    import tensorboardX.event_file_writer as efw

    fake = types.SimpleNamespace(now=1_700_000_000.0)
    fake.time = lambda: fake.now
    monkeypatch.setattr(efw, "time", fake)
    return fake


def events(folder):
    """Each event file's Event protos, files in name order (TFRecord framing: length, its
    CRC, the Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    for path in sorted(folder.glob("events.out.tfevents.*"), key=lambda p: p.name):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            yield event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 16 + length


def view(folder, *, rust=False) -> dict[str, list[tuple[int, object]]]:
    """tag -> [(step, value)] as TensorBoard shows the folder (module docstring); a
    scalar's value is its float, a text's its string."""
    from tensorboardX.proto import event_pb2

    shown: dict[str, list[tuple[int, object]]] = defaultdict(list)
    for e in events(folder):
        start = e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START
        if start and not rust:
            for tag in shown:
                shown[tag] = [(s, v) for s, v in shown[tag] if s < e.step]
        for v in e.summary.value:
            value = v.tensor.string_val[0].decode() if v.HasField("tensor") else v.simple_value
            if rust:
                shown[v.tag] = [(s, x) for s, x in shown[v.tag] if s < e.step]
            shown[v.tag].append((e.step, value))
    return dict(shown)


def write_scalars(run, steps, scale, **kwargs):
    writer = MetricsWriter(run, config=TB, **kwargs)
    for s in steps:
        writer.write(s, {"loss": scale * s})
    writer.close()


def test_resumed_metrics_show_each_step_once(tmp_path, clock):
    write_scalars(tmp_path, range(1, 6), 1.0)
    clock.now += 60  # resumed from the step-3 checkpoint, a minute later
    write_scalars(tmp_path, (4, 5), 10.0, resume_step=3)
    expected = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == expected
    assert view(tmp_path / "tensorboard")["loss"] == expected
    assert view(tmp_path / "tensorboard", rust=True)["loss"] == expected


def test_a_fresh_start_hides_an_earlier_attempts_events(tmp_path, clock):
    """metrics.jsonl starts empty on a fresh start; so does what TensorBoard shows."""
    write_scalars(tmp_path, range(1, 4), 1.0)
    clock.now += 60
    write_scalars(tmp_path, (1, 2), 5.0)
    assert view(tmp_path / "tensorboard")["loss"] == [(1, 5.0), (2, 10.0)]


def run_session(run, tok, clock, steps, *, resume_step=None, scale=1.0, samples=2):
    """As `jaxrl-llm train` does: the generation log is built with the run, the metrics
    writer when training starts (after the model loads), then each step writes both."""
    generations = GenerationLog(run, samples, tok)
    clock.now += 5  # the model loads
    writer = MetricsWriter(run, config=TB, resume_step=resume_step)
    for s in steps:
        generations.write(s, rollout(tok))
        writer.write(s, {"loss": scale * s})
    generations.close()
    writer.close()


def text_steps(shown):
    """(step, samples in its text) of the generations shown."""
    return [(s, text.count("**step ")) for s, text in shown["generations/text_summary"]]


# The first session logs 2 samples a step, the resumed one 1: tells whose text is shown.
TEXTS = [(1, 2), (2, 2), (3, 2), (4, 1), (5, 1)]


def test_resumed_run_with_generations_shows_each_step_once(tmp_path, tokenizer, clock):  # noqa: F811
    run_session(tmp_path, tokenizer, clock, range(1, 6))
    clock.now += 60
    run_session(tmp_path, tokenizer, clock, (4, 5), resume_step=3, scale=10.0, samples=1)
    for rust in (False, True):
        shown = view(tmp_path / "tensorboard", rust=rust)
        assert shown["loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)], rust
        assert text_steps(shown) == TEXTS, rust


def test_a_resumed_generation_log_alone_shows_each_step_once(tmp_path, tokenizer, clock):  # noqa: F811
    """Without a metrics writer's TensorBoard (MetricsConfig.tensorboard = False) the
    generation log discards the steps it rewrites itself."""
    log = GenerationLog(tmp_path, 2, tokenizer)
    for s in range(1, 6):
        log.write(s, rollout(tokenizer))
    log.close()
    clock.now += 60
    log = GenerationLog(tmp_path, 1, tokenizer)
    for s in (4, 5):
        log.write(s, rollout(tokenizer))
    log.close()
    assert text_steps(view(tmp_path / "tensorboard")) == TEXTS
