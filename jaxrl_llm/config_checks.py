"""Config dataclasses check their own fields: types from the annotations, declared ranges.

A wrong value in a gin file or `--gin_param` must fail when the config is built, before any
model loads or compiles, with one message naming the class, the field, the value and what
was expected (`OptimConfig.lr = 'abc': expected float > 0`), not a traceback from deep in
the run. Every gin-configurable dataclass uses one decorator, placed under
`@dataclasses.dataclass` so the dataclass's `__init__` calls the check first:

    @gin.configurable
    @dataclasses.dataclass(frozen=True)
    @checked_fields(lr=Gt(0), b1=Interval(ge=0, lt=1), decay=("constant", "cosine"))
    class OptimConfig: ...

Types are checked by pydantic (`TypeAdapter`, strict: no "1e-5" strings for floats, no
`True` for ints; an int is a float) against the resolved annotations; a gin list for a
`tuple[...]` field becomes a tuple. Ranges are `annotated_types` constraints (what pydantic
reads) or a tuple of the allowed values; either applies to the value when it is not None.
A class's own `__post_init__` (cross-field rules) runs after the checks. This module sits
below every config (it imports no other jaxrl_llm module), so any layer can use it.

Every field says what it means in its metadata, `documented(default, "What it does.")`; the
ranges stay on the class (`field_ranges`), so `config_reference` renders both into
docs/config.md.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union

from annotated_types import Ge, Gt, Interval, Le, Lt

__all__ = [
    "ConfigError",
    "Ge",
    "Gt",
    "Interval",
    "Le",
    "Lt",
    "checked_fields",
    "describe_range",
    "documented",
    "field_doc",
    "field_ranges",
]

T = TypeVar("T")
Bound = Ge | Gt | Le | Lt | Interval
Range = Bound | tuple  # a bound, or the allowed values
_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
_RANGES = "__checked_ranges__"  # the class attribute `checked_fields` stores its ranges in
_DOC = "doc"  # the metadata key of a field's description


# float32's largest number: a value a float32 program holds (a sampling temperature) must not
# exceed it (1e39 is finite in Python and inf in float32).
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(ValueError):
    """A gin file, binding or config value is wrong (unknown key, bad value, missing file)."""


class OutDirInUseError(ConfigError, FileExistsError):
    """An output folder holds a finished model and overwriting was not asked for
    (`--overwrite`): `sft` / `rm`'s out_dir with its `hf/`, `export`'s --out."""


class PluginImportError(ConfigError, ImportError):
    """A plug-in the config names ("package.module:factory": a tool, environment, reward or
    sampler backend) cannot be imported."""


class PluginContractError(ConfigError, TypeError):
    """A plug-in the config names is not what its setting needs (not callable, or what it
    returned lacks the contract's methods)."""


def documented(
    default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = dataclasses.MISSING
) -> Any:
    """A dataclass field with a default (or a `factory`, e.g. a nested config class; neither:
    required) and `doc`, what it means to a user, kept in the field's metadata."""
    if not doc.strip():
        raise TypeError("documented(...): give the field a description, doc='...'")
    return dataclasses.field(default=default, default_factory=factory, metadata={_DOC: doc})


def field_doc(field: dataclasses.Field) -> str:
    """The description `documented` gave `field` ("" when it has none)."""
    return field.metadata.get(_DOC, "")


def field_ranges(cls: type) -> dict[str, Range]:
    """The ranges `checked_fields` declared on `cls` (field name -> bound or allowed values)."""
    return dict(getattr(cls, _RANGES, {}))


def checked_fields(**ranges: Range) -> Callable[[type[T]], type[T]]:
    """Class decorator (under `@dataclasses.dataclass`): check every field at construction.

    `ranges` maps field names to `Gt`/`Ge`/`Lt`/`Le`/`Interval` or to a tuple of the allowed
    values; a name that is not an annotated field of the class is a mistake in the code and
    fails at import.
    """

    def decorate(cls: type[T]) -> type[T]:
        unknown = sorted(set(ranges) - set(inspect.get_annotations(cls)))
        if unknown:
            raise TypeError(f"checked_fields on {cls.__name__}: no fields named {unknown}")
        for name, rng in ranges.items():
            if not isinstance(rng, Bound | tuple):
                raise TypeError(f"checked_fields {cls.__name__}.{name}: {rng!r} is not a range")
        setattr(cls, _RANGES, dict(ranges))
        own_post_init = cls.__dict__.get("__post_init__")

        def __post_init__(self) -> None:
            check_fields(self, ranges)
            if own_post_init is not None:
                own_post_init(self)

        cls.__post_init__ = __post_init__  # pyright: ignore[reportAttributeAccessIssue]
        return cls

    return decorate


def check_fields(obj: Any, ranges: dict[str, Range]) -> None:
    """Check (and normalise: list -> tuple, int -> float) each field of dataclass `obj`."""
    import pydantic  # here, not at import: `jaxrl-llm --help` reads ConfigError only

    cls = type(obj)
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        expected, validate = _field_checks(cls, field.name, ranges.get(field.name))
        try:
            checked = validate(value)
        except (pydantic.ValidationError, TypeError):
            raise ConfigError(
                f"{cls.__name__}.{field.name} = {value!r}: expected {expected}"
            ) from None
        if type(checked) is not type(value):
            object.__setattr__(obj, field.name, checked)  # frozen dataclasses too


@functools.cache
def _field_checks(cls: type, name: str, rng: Range | None) -> tuple[str, Callable[[Any], Any]]:
    """(what is expected, in words; a function returning the checked value or raising)."""
    try:
        hint = typing.get_type_hints(cls)[name]
    except NameError as e:  # an annotation names something the module does not define
        raise TypeError(f"{cls.__name__}.{name}: annotation cannot be resolved: {e}") from e
    field_type = next(f.type for f in dataclasses.fields(cls) if f.name == name)
    written = field_type if isinstance(field_type, str) else _type_name(hint)
    expected = written + (f" ({describe_range(rng)})" if rng is not None else "")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):

        def check_instance(value: Any) -> Any:
            if not isinstance(value, hint):
                raise TypeError(name)
            return value

        return expected, check_instance
    import pydantic

    non_none, optional = _split_optional(hint)
    if isinstance(rng, tuple):
        constrained = Literal[rng]  # pyright: ignore[reportInvalidTypeForm]
    else:
        constrained = Annotated[non_none, rng] if rng is not None else non_none
    # No config number is infinite or NaN (a NaN passes no range; an inf passes `> 0`).
    finite = pydantic.ConfigDict(allow_inf_nan=False)
    adapter = pydantic.TypeAdapter(constrained | None if optional else constrained, config=finite)
    to_tuple = typing.get_origin(non_none) is tuple

    def check_value(value: Any) -> Any:
        if to_tuple and isinstance(value, list):  # gin writes [1, 2] as a list
            value = tuple(value)
        return adapter.validate_python(value, strict=True)

    return expected, check_value


def _split_optional(hint: Any) -> tuple[Any, bool]:
    """(`hint` without None, whether None was allowed)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return functools.reduce(lambda a, b: a | b, args), True
    return hint, False


def describe_range(rng: Range) -> str:
    """A range in words: "> 0 and <= 1", "one of 'constant', 'cosine'"."""
    if isinstance(rng, tuple):
        return "one of " + ", ".join(repr(v) for v in rng)
    parts = [f"{sign} {getattr(rng, key)}" for key, sign in _BOUNDS if hasattr(rng, key)]
    parts = [p for p in parts if not p.endswith(" None")]
    return " and ".join(parts)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def with_options(base: T, options: Mapping[str, Any], owner: str) -> T:
    """The config dataclass `base` with `options` (a reward's own settings from
    `RewardConfig.weights`, say) applied; an option that is not one of its fields is a
    `ConfigError` naming `owner` and the fields it takes."""
    fields = sorted(f.name for f in dataclasses.fields(base))  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {unknown}; it takes {fields}")
    return dataclasses.replace(base, **dict(options))  # type: ignore[type-var]
