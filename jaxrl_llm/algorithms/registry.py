"""Name -> function tables for the algorithm options a config can pick.

Each kind of option (``advantage``, ``policy_loss``, ``kl``, ``loss_agg``) is one table of
small functions. A config names an option by string; :func:`resolve` turns it into a callable
once, at start-up, so a typo or an unknown keyword fails with the list of valid choices before
anything is traced or compiled.

Example::

    adv_fn = resolve("advantage", "grpo", group_size=8)       # at start-up
    advantages, returns = adv_fn(token_rewards, response_mask)  # inside the jitted step

What an option needs from the rest of the run (a critic, a group of samples per prompt) is
a :class:`Capabilities` record registered with the function, and the config asks
:func:`capabilities`, never the name: a new estimator that needs a critic gets one.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

KINDS = ("advantage", "policy_loss", "kl", "loss_agg")

_TABLES: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a registered function needs from the run, declared at its registration.

    needs_critic: the run builds and trains a value model whose values the function reads
        (verl's ``need_critic``); ``RLConfig.uses_critic`` is this flag.
    min_group_size: the fewest samples per prompt (``rollout.n``) the method is defined for;
        a leave-one-out or group-normalised baseline of one sample is the sample itself, so
        GRPO and RLOO would give every sample advantage 0.
    group_baseline: the advantage subtracts a statistic of the prompt's group of samples
        (GRPO's mean, RLOO's leave-one-out mean, REINFORCE++-baseline's mean), so a group
        whose scores are all equal gets advantage 0 (`batch/all_equal_groups_frac`).
    reads: the optional inputs (keyword arguments) the function reads, e.g. ``("values",)``;
        checked against its signature at registration.
    paper_clip: ``(clip_low, clip_high)`` of a policy loss's paper where PPO's 0.2 does not
        fit (GSPO clips a sequence ratio, which stays near 1, at 3e-4 / 4e-4); the config
        warns when a run clips far wider.
    """

    needs_critic: bool = False
    min_group_size: int = 1
    group_baseline: bool = False
    reads: tuple[str, ...] = ()
    paper_clip: tuple[float, float] | None = None


_CAPABILITIES: dict[str, dict[str, Capabilities]] = {kind: {} for kind in KINDS}


def _table(kind: str) -> dict[str, Callable[..., Any]]:
    if kind not in _TABLES:
        raise ValueError(f"unknown option kind {kind!r}; kinds are: {', '.join(KINDS)}")
    return _TABLES[kind]


def register(kind: str, *names: str, **capabilities: Any) -> Callable[[F], F]:
    """Decorator: register a function under one or more names (aliases) of ``kind``, with
    its :class:`Capabilities` given as keywords (``needs_critic=True``, ``min_group_size=2``).

    Registering a different function, or the same one with other capabilities, under a taken
    name is an error (two modules silently fighting over a name is worse than a crash at
    import); so is a ``reads`` entry the function has no parameter for.
    """
    if not names:
        raise ValueError("register needs at least one name")
    table, caps = _table(kind), Capabilities(**capabilities)

    def decorator(fn: F) -> F:
        unread = [r for r in caps.reads if r not in inspect.signature(fn).parameters]
        if unread:
            raise ValueError(f"{kind} {names[0]!r} declares reads={unread} but takes no such input")
        for name in names:
            if name in table and (table[name] is not fn or _CAPABILITIES[kind][name] != caps):
                raise ValueError(f"{kind} {name!r} is already registered to {table[name]!r}")
        for name in names:
            table[name] = fn
            _CAPABILITIES[kind][name] = caps
        return fn

    return decorator


def unregister(kind: str, name: str) -> None:
    """Remove ``name`` (a test's temporary option); unknown names are an error."""
    lookup(kind, name)
    del _TABLES[kind][name], _CAPABILITIES[kind][name]


def available(kind: str) -> tuple[str, ...]:
    """Sorted names registered for ``kind``."""
    return tuple(sorted(_table(kind)))


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The function registered as ``name``; a ValueError lists the choices if there is none."""
    table = _table(kind)
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(available(kind))}")
    return table[name]


def capabilities(kind: str, name: str) -> Capabilities:
    """The :class:`Capabilities` ``name`` was registered with (a ValueError lists the
    choices if there is no such name)."""
    lookup(kind, name)
    return _CAPABILITIES[kind][name]


def resolve(kind: str, name: str, /, **kwargs: Any) -> Callable[..., Any]:
    """Look ``name`` up and bind keyword hyperparameters, checking them against its signature.

    Returns ``functools.partial(fn, **kwargs)`` (or ``fn`` itself when no kwargs are given).
    An unknown keyword raises a ValueError naming the keywords the function accepts.
    """
    fn = lookup(kind, name)
    if not kwargs:
        return fn
    params = inspect.signature(fn).parameters
    keyword_ok = {
        p.name
        for p in params.values()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    unknown = sorted(set(kwargs) - keyword_ok)
    if unknown:
        raise ValueError(
            f"{kind} {name!r} does not take {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(keyword_ok))}"
        )
    return functools.partial(fn, **kwargs)


def resolve_declared(kind: str, name: str, /, **options: Any) -> Callable[..., Any]:
    """`resolve` with only the `options` that the function declares as keyword-only
    parameters: a trainer hands over every hyperparameter it has and each registered function
    takes its own (GRPO `group_size` and `norm_by_std`, GAE `gamma` and `lam`, ...), so no
    caller branches on the name."""
    declared = {
        p.name
        for p in inspect.signature(lookup(kind, name)).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    return resolve(kind, name, **{k: v for k, v in options.items() if k in declared})
