"""Without bubblewrap the sandbox refuses to run code (it fails closed). The tests here
then opt in to the weaker "subprocess" backend through gin, as a user would, so the
behaviour that does not depend on isolation (output, limits, tool turns) is still tested;
the guarantees only bubblewrap gives are skipped in the adversarial suite, and
test_sandbox_settings.py checks the refusal itself with explicit backends."""

import gin
import pytest

from jaxrl_llm.tools.sandbox import bwrap_available


@pytest.fixture(autouse=True, scope="module")  # before module-scoped tools are built
def _subprocess_sandbox_without_bwrap():
    if bwrap_available():
        yield
        return
    gin.bind_parameter("SandboxConfig.backend", "subprocess")
    yield
    gin.clear_config()
