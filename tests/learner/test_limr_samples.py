"""LIMR's per-sample records of an RL run describe the data order: record i is batch i of
the prompt iterator (`PromptBatch.index == i - 1`), every prompt drawn, with the rewards its
samples got, also when DAPO's dynamic sampling drops groups and draws extra batches."""

import collections
import json

import numpy as np
import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.data import limr
from jaxrl_llm.learner import rl_loop
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS


@pytest.mark.slow  # measured: 30 s on 2 shared cores (one 4-step run, 8 rollouts)
def test_dynamic_sampling_records_every_drawn_batch_in_data_order(tmp_path, monkeypatch):
    """8 prompts, 2 per batch (4 batches per epoch). The first group of every batch counts
    as all-equal, so dynamic sampling drops it and each of the 4 steps draws 2 batches: 8
    batches, 2 epochs. Every batch is recorded under its position in the data order, dropped
    groups included, so each epoch's records hold every prompt once (G samples) with the
    rewards the rollout gave it, and LIMR scores all 8 prompts."""
    register_test_rewards()
    drawn = []  # (batch, the scored rollout) of every generate call
    generate = RolloutStage.generate

    def recording_generate(self, batch, *args, **kwargs):
        got = generate(self, batch, *args, **kwargs)
        drawn.append((batch, got))
        return got

    monkeypatch.setattr(RolloutStage, "generate", recording_generate)
    monkeypatch.setattr(
        rl_loop, "all_equal_groups", lambda scores, n: np.arange(len(scores) // n) == 0
    )
    run_dir = tmp_path / "run"
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", "RLConfig.steps = 4",
                   "RLConfig.save_every = 0", "DataConfig.builtin_train_size = 8",
                   "AlgoConfig.dynamic_sampling = True", "AlgoConfig.max_sampling_tries = 3",
                   "RolloutConfig.max_new_tokens = 4"])  # fmt: skip
    records = rl_loop.run_rl(RLConfig())
    assert [r["dynamic_sampling/tries"] for r in records] == [2, 2, 2, 2]

    G = 4  # TINY_RL_PARAMS' RolloutConfig.n
    assert [batch.index for batch, _ in drawn] == list(range(8))
    assert [batch.epoch for batch, _ in drawn] == [0] * 4 + [1] * 4
    names = sorted(p.name for p in (run_dir / limr.SAMPLES_DIR).iterdir())
    assert names == sorted(f"step_{i}.jsonl" for i in range(1, 9))
    for batch, got in drawn:
        record = batch.index + 1
        assert list(got.prompt_ids) == batch.ids
        expected = "".join(
            json.dumps({"step": record, "prompt_id": pid, "reward": float(r)}) + "\n"
            for pid, r in zip(np.repeat(batch.ids, G), got.scores, strict=True)
        )
        text = (run_dir / limr.SAMPLES_DIR / f"step_{record}.jsonl").read_text()
        assert text == expected, record
    for epoch in (0, 1):
        seen = collections.Counter()
        for record in range(4 * epoch + 1, 4 * epoch + 5):
            path = run_dir / limr.SAMPLES_DIR / f"step_{record}.jsonl"
            seen.update(json.loads(line)["prompt_id"] for line in path.read_text().splitlines())
        assert len(seen) == 8 and set(seen.values()) == {G}, (epoch, seen)
    scores = limr.score_run(run_dir, steps_per_epoch=4, epochs=2)
    assert len(scores.ids) == 8 and scores.dropped == [] and scores.backfilled == 0
