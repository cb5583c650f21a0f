"""First-fit-decreasing packing of sequences into rows: the one host-side bin packer, shared
by the learner's packed forwards (`learner/packing.py`) and the reward model's packed
scoring (`rewards/model.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Lengths = Sequence[int] | np.ndarray  # tokens per sequence


def first_fit_rows(lengths: Lengths, seq_len: int) -> list[list[int]]:
    """Sequence indices per row: longest first, each into the first row with room (FFD)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for j in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        n = int(lengths[j])
        if not 0 < n <= seq_len:
            raise ValueError(f"sample {j} has {n} tokens; a packed row holds 1..{seq_len}")
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(j)
                room[r] -= n
                break
        else:
            rows.append([j])
            room.append(seq_len - n)
    return rows
