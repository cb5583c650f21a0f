"""A step's update metrics (`learn.update`, then `learn.fetch`) over its mini-batch updates:
an update that trained no token (every sample of its mini-batch overlong-filtered) adds
nothing to the step's means and extremes, instead of pulling them toward 0."""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.learner import learn

B, T = 12, 4


def _update_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """`learn.update` then `learn.fetch` with a policy step that reports `per_update`'s
    metrics in turn, no critic."""
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    reports = iter(per_update)

    def policy_step(state, mb, packing, frozen):
        return state, {k: jnp.asarray(v, jnp.float32) for k, v in next(reports).items()}

    cfg = SimpleNamespace(
        algo=SimpleNamespace(ppo_epochs=1, mini_batches=len(per_update), micro_batch_size=1),
        policy=SimpleNamespace(pack_sequences=False), seed=0, seq_len=T,
    )  # fmt: skip
    learner = SimpleNamespace(
        mesh=mesh, micro_batches=lambda batch, rows: None, critic_step=None,
        policy_step=policy_step, frozen=None,
        state=SimpleNamespace(policy=SimpleNamespace(step=jnp.asarray(1)), critic=None),
    )  # fmt: skip
    exp = SimpleNamespace(
        batch=SimpleNamespace(input_ids=np.zeros((B, T), np.int32)), length=np.full(B, T)
    )
    _, _, out, _ = learn.update(cfg, learner, 1, exp)  # pyright: ignore[reportArgumentType]
    return learn.fetch(out)


def _report(tokens, entropy, clip_max, adv_min, skipped=0.0):
    return {
        "actor/entropy": entropy, "actor/pg_clipfrac/max": clip_max,
        "critic/advantages/min": adv_min, "actor/skipped": skipped,
        "actor/trained_tokens": tokens,
    }  # fmt: skip


def test_an_update_without_trained_tokens_adds_nothing_to_the_step_metrics():
    # The middle update trained nothing: its 0s are not values.
    got = _update_metrics([
        _report(3, 0.5, 0.5, 0.125), _report(0, 0.0, 0.0, 0.0, skipped=1.0),
        _report(5, 0.25, 0.25, 0.5),
    ])  # fmt: skip
    assert got["actor/entropy"] == 0.375  # (0.5 + 0.25) / 2, exact in float32
    assert got["actor/pg_clipfrac/max"] == 0.5
    assert got["critic/advantages/min"] == 0.125
    assert got["actor/skipped"] == np.float32(1 / 3)  # a share of all updates
    assert "actor/trained_tokens" not in got


def test_a_step_without_trained_tokens_logs_nan_not_zero():
    got = _update_metrics([_report(0, 0.0, 0.0, 0.0), _report(0, 0.0, 0.0, 0.0)])
    for k in ("actor/entropy", "actor/pg_clipfrac/max", "critic/advantages/min"):
        assert math.isnan(got[k]), k
    assert got["actor/skipped"] == 0.0


def test_with_tokens_in_every_update_the_metrics_are_the_plain_reduction():
    rng = np.random.default_rng(0)
    reports = [_report(t, *rng.normal(size=3)) for t in (1, 7, 2, 4)]
    got = _update_metrics(reports)
    plain = learn.fetch({
        k: [jnp.asarray(r[k], jnp.float32) for r in reports]
        for k in ("actor/entropy", "actor/pg_clipfrac/max", "critic/advantages/min")
    })  # fmt: skip
    for k, v in plain.items():
        assert got[k] == v, (k, got[k], v)  # bit for bit
