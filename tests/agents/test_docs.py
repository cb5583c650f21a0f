"""docs/agents.md shows its worked examples as they are: the environment plug-in and the
chat-format tool factory appear verbatim in its ```python blocks (the tests beside them run
those files, so the page's code is tested code)."""

import re
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "agents.md"


@pytest.mark.parametrize("example", ["env_example.py", "tools_example.py"])
def test_the_docs_show_the_example_verbatim(example):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert (HERE / example).read_text() in blocks
