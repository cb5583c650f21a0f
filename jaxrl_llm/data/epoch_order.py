"""Which order each epoch of the prompts is drawn in: `epoch_seed`, the shuffle seed of an
epoch (`data.pipeline.PromptPipeline` permutes the prompts with Grain's `index_shuffle`)."""

from __future__ import annotations

import functools
import hashlib


@functools.lru_cache(maxsize=64)
def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of ``epoch``: ``seed`` for epoch 0 (Grain's ``MapDataset.shuffle(seed)``
    order), then 4 bytes of sha256("<seed>:<epoch>"), so two (seed, epoch) pairs share an
    order only by a 2**-32 chance. Grain's own seed + e gave seed s + 1's first epoch to seed
    s's second: seed sweeps (DataConfig.seed = 0, 1, ...) were not independent."""
    if epoch == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "little")
