"""Shared tiny RL settings for the trainer tests (built-in checkpoint, a dense test reward),
and random packed rows for the step and experience tests."""

import numpy as np

TINY_RL_PARAMS = [
    "RLConfig.steps = 6",
    "RLConfig.eval_every = 0",
    "RLConfig.save_every = 3",
    "RLConfig.seed = 3",
    "DataConfig.prompts_per_step = 2",
    "DataConfig.val_size = 4",
    "DataConfig.builtin_train_size = 16",
    "DataConfig.builtin_levels = (1,)",
    "RolloutConfig.n = 4",
    "RolloutConfig.max_new_tokens = 16",
    "RolloutConfig.max_slots = 8",
    "AlgoConfig.mini_batches = 2",
    "AlgoConfig.micro_batch_size = 2",
    "RewardConfig.name = 'digit_fraction'",
    "RewardConfig.workers = 1",
    "OptimConfig.lr = 1e-3",
    # One of the 8 simulated devices: a tiny model's step over all 8 (FSDP, a collective per
    # layer, 8 device tasks on 2 cores) ran 5x slower, its first step 1.3x (docs/testing.md).
    # The tests of sharded runs add "MeshConfig.devices = -1" (all).
    "MeshConfig.devices = 1",
]


def random_rows(rng: np.random.Generator, batch: int, length: int, vocab: int):
    """Token ids [B, T] and a response mask [B, T]: each row a prompt of 2-5 tokens, then a
    response of at least 2, then padding."""
    ids = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        start = rng.integers(2, 6)
        mask[b, start : start + rng.integers(2, length - start)] = 1
    return ids, mask
