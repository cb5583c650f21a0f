"""Progress bars for rollout and update (OpenRLHF-style), quiet when not on a terminal."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def interactive() -> bool:
    return sys.stderr.isatty()


def bar(desc: str, total: int, *, unit: str = "it") -> tqdm:
    """A tqdm bar that disables itself when stderr is not a terminal (logs, CI)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not interactive(),
                dynamic_ncols=True)  # fmt: skip
