"""docs/config.md is generated from the config classes, and every setting describes itself."""

import dataclasses
import inspect

import gin
import pytest

from jaxrl_llm import config_reference
from jaxrl_llm.config_checks import Ge, Interval, checked_fields, documented, field_doc
from jaxrl_llm.config_reference import COMMAND, DOC_PATH, config_classes, render, render_class
from tests.test_config import CONFIG_CLASSES  # every *Config dataclass, found in the sources


def _gin_configurable(cls: type) -> bool:
    try:
        return gin.get_configurable(cls.__name__) is cls
    except ValueError:
        return False


GIN_CLASSES = [c for c in CONFIG_CLASSES if _gin_configurable(c)]


def test_docs_config_md_is_the_generators_output():
    assert DOC_PATH.read_text(encoding="utf-8") == render(), (
        f"docs/config.md is out of date with the config classes: regenerate it with `{COMMAND}`"
    )


def test_every_gin_configurable_config_class_is_in_the_reference():
    assert len(GIN_CLASSES) >= 10
    missing = sorted(c.__name__ for c in set(GIN_CLASSES) - set(config_classes()))
    assert missing == [], f"add them to config_reference.config_classes(), then run `{COMMAND}`"


@pytest.mark.parametrize("cls", GIN_CLASSES, ids=lambda c: c.__name__)
def test_every_field_has_a_description_and_the_class_a_docstring(cls):
    undocumented = [f.name for f in dataclasses.fields(cls) if not field_doc(f).strip()]
    assert undocumented == [], (
        f"{cls.__name__}: give {undocumented} a description, "
        "`name: T = documented(default, 'What it means.')` (jaxrl_llm/config_checks.py)"
    )
    doc = inspect.getdoc(cls) or ""
    assert doc and not doc.startswith(f"{cls.__name__}("), f"{cls.__name__} has no docstring"


def test_the_table_shows_ranges_defaults_and_factories():
    @dataclasses.dataclass(frozen=True)
    class InnerConfig:
        """Inner."""

        k: int = documented(1, "Inner value.")

    @dataclasses.dataclass(frozen=True)
    @checked_fields(lr=Interval(ge=0, lt=1), steps=Ge(1), mode=("a", "b"))
    class ToyConfig:
        """A toy."""

        path: str = documented(doc="Where it is.")
        lr: float = documented(0.5, "Step size.")
        steps: int = documented(3, "How many.")
        mode: str = documented("a", "Which one.")
        maybe: str | None = documented(None, "Optional | piped.")
        inner: InnerConfig = documented(doc="Nested.", factory=InnerConfig)

    table = render_class(ToyConfig)
    assert "In gin: `ToyConfig.path = <value>`" not in table  # a plain default is shown
    assert "In gin: `ToyConfig.lr = 0.5`" in table
    assert "| `path` | `str` | `required` |  | Where it is. |" in table
    assert "| `lr` | `float` | `0.5` | >= 0 and < 1 | Step size. |" in table
    assert "| `steps` | `int` | `3` | >= 1 | How many. |" in table
    assert "| `mode` | `str` | `'a'` | one of 'a', 'b' | Which one. |" in table
    assert "| `maybe` | `str \\| None` | `None` |  | Optional \\| piped. |" in table
    assert "| `inner` | `InnerConfig` | `InnerConfig()` |  | Nested. |" in table


def test_a_declared_range_of_a_real_config_is_in_the_page():
    page = render()
    assert "| `lr` | `float` | `1e-06` | > 0 |" in page
    assert "one of 'constant', 'cosine', 'linear'" in page
    assert (
        "Built as `RLConfig.optim`, `RLConfig.critic_optim`, `SFTConfig.optim`, `RMConfig.optim`."
        in page
    )


def test_a_field_without_a_description_is_refused():
    with pytest.raises(TypeError, match="description"):
        documented(1)


def test_main_writes_the_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(config_reference, "DOC_PATH", tmp_path / "config.md")
    assert config_reference.main(["--write"]) == 0
    assert (tmp_path / "config.md").read_text(encoding="utf-8") == render()
    assert config_reference.main([]) == 0
    assert capsys.readouterr().out.endswith(render())
