"""A run's record of its configuration: the operative gin config written beside its outputs.

Apart from `config.py` (gin parsing), which imports every module gin configures, so that
those modules (the SFT and reward-model trainers) can write their record without a cycle.
"""

from __future__ import annotations

import os

import gin
from etils import epath


def write_resolved_config(run_dir: str | os.PathLike) -> epath.Path:
    """Write the operative config (every parameter used, defaults included) to config.gin.

    Call it after the config objects are built: gin records a value when it is used.
    """
    path = epath.Path(run_dir) / "config.gin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(gin.operative_config_str())
    return path
