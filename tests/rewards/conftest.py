"""Every test here starts from an empty gin config: the rewards' configs are built directly
(`RewardConfig(...)`), and an end-to-end test elsewhere that parsed a run's gin bindings
(e.g. `RewardConfig.name = 'rm:...'`) must not change what they build."""

import gin
import pytest


@pytest.fixture(autouse=True)
def _empty_gin():
    gin.clear_config()
    yield
    gin.clear_config()
