"""A step's update metrics (`learn.update`, then `learn.fetch`) over its mini-batch updates:
an update that trained no token (every sample of its mini-batch overlong-filtered) adds
nothing to the step's means and extremes, instead of pulling them toward 0, and a step that
trained none reports `actor/trained_tokens` 0 and not the metrics over nothing."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.learner import learn
from jaxrl_llm.metrics.health import HealthMonitor

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
        policy_step=policy_step, frozen=None, compiler=SimpleNamespace(wait=lambda: None),
        state=SimpleNamespace(policy=SimpleNamespace(step=jnp.asarray(1)), critic=None),
    )  # fmt: skip
    exp = SimpleNamespace(
        batch=SimpleNamespace(input_ids=np.zeros((B, T), np.int32)), length=np.full(B, T)
    )
    plan = learn.mini_batch_plan(cfg, mesh, 1, exp.length)  # pyright: ignore[reportArgumentType]
    _, _, out, _ = learn.update(cfg, learner, 1, exp, plan)  # pyright: ignore[reportArgumentType]
    return learn.fetch(out)


def _report(tokens, entropy, clip_max, ratio_min, skipped=0.0, **more):
    return {
        "actor/entropy": entropy, "actor/pg_clipfrac/max": clip_max,
        "actor/ratio/min": ratio_min, "actor/skipped": skipped,
        "actor/trained_tokens": tokens, **more,
    }  # fmt: skip


def test_an_update_without_trained_tokens_adds_nothing_to_the_step_metrics():
    # The middle update trained nothing: its 0s are not values. Before the counts, the step
    # read entropy 0.25 (the 0 averaged in) and ratio min 0.
    got = _update_metrics([
        _report(3, 0.5, 0.5, 0.125), _report(0, 0.0, 0.0, 0.0),
        _report(5, 0.25, 0.25, 0.5, skipped=1.0),
    ])  # fmt: skip
    assert got["actor/entropy"] == 0.375  # (0.5 + 0.25) / 2, exact in float32
    assert got["actor/pg_clipfrac/max"] == 0.5
    assert got["actor/ratio/min"] == 0.125
    assert got["actor/skipped"] == np.float32(1 / 3)  # a share of all updates
    assert got["actor/trained_tokens"] == np.float32(8 / 3)  # per update
    assert got["actor/lr_step"] == 1


def test_a_step_without_trained_tokens_reports_the_count_not_the_metrics():
    got = _update_metrics([_report(0, 0.0, 0.0, 0.0), _report(0, 0.0, 0.0, 0.0)])
    assert got == {
        "actor/skipped": 0.0, "actor/trained_tokens": 0.0, "actor/lr_step": 1.0,
    }  # fmt: skip
    # Nothing non-finite for the health check to read as a divergence.
    assert HealthMonitor().check(1, got) == []


def test_the_mask_modes_is_metrics_count_the_tokens_it_checked():
    # Every token of the second update rejected: nothing trained, but its is/* describe the
    # 4 tokens the rejection read (is/clipped_frac 1: the sign to see).
    got = _update_metrics([
        _report(2, 0.5, 0.5, 0.5, **{"is/clipped_frac": 0.0, "is/checked_tokens": 2}),
        _report(0, 0.0, 0.0, 0.0, **{"is/clipped_frac": 1.0, "is/checked_tokens": 4}),
    ])  # fmt: skip
    assert got["is/clipped_frac"] == 0.5
    assert got["actor/entropy"] == 0.5
    assert "is/checked_tokens" not in got


def test_with_tokens_in_every_update_the_metrics_are_the_plain_reduction():
    rng = np.random.default_rng(0)
    reports = [_report(t, *rng.normal(size=3)) for t in (1, 7, 2, 4)]
    got = _update_metrics(reports)
    names = ("actor/entropy", "actor/pg_clipfrac/max", "actor/ratio/min")
    stacked = {k: np.asarray([r[k] for r in reports], np.float32) for k in names}
    assert got["actor/entropy"] == float(jnp.mean(stacked["actor/entropy"]))  # bit for bit
    assert got["actor/pg_clipfrac/max"] == stacked["actor/pg_clipfrac/max"].max()
    assert got["actor/ratio/min"] == stacked["actor/ratio/min"].min()
