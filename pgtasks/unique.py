"""Unique tasks: a second enqueue with the same key returns the task that holds it.

A key comes from the call (``apply_async(..., unique_key="invoice:42")``) or from the task's
``unique_on`` (argument names, or a function of the arguments), and is held per task: the same
key on two tasks names two keys. How long a key is held is
``unique_for``:

* ``"finished"`` (the default): while its task waits or runs; a retry waiting for its
  countdown still holds it.
* ``"started"``: while its task waits; once a worker starts it, the next enqueue goes in.
* a duration (``timedelta`` or seconds): for that long after the first enqueue, whatever
  happens to the task meanwhile.

Races between producers are settled in the database (a partial unique index for the first two,
a locked key row for windows), so concurrent enqueues of one key insert exactly one task.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

FINISHED = "finished"
STARTED = "started"

UniqueOn = Sequence[str] | Callable[..., Any]
UniqueFor = float | int | timedelta | str


@dataclass(frozen=True)
class Hold:
    """How long a key is held: a window in seconds, else by the task's status."""

    window: float | None = None
    until_started: bool = False


def hold(value: UniqueFor | None) -> Hold:
    """Check ``unique_for`` and say what it means."""
    if value is None or value == FINISHED:
        return Hold()
    if value == STARTED:
        return Hold(until_started=True)
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(
            f"unique_for must be {FINISHED!r}, {STARTED!r}, a timedelta or seconds, not {value!r}"
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"unique_for must be a positive, finite duration, not {value!r}")
    return Hold(window=seconds)


def call_signature(fun: Callable[..., Any], bound: bool) -> inspect.Signature | None:
    """The arguments a caller passes to ``fun`` (without ``self`` for a bound task); None
    where Python cannot tell."""
    try:
        sig = inspect.signature(fun)
    except (TypeError, ValueError):
        return None
    if bound:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return sig


def check_unique_on(
    task_name: str,
    sig: inspect.Signature | None,
    unique_on: UniqueOn | None,
    option: str = "unique_on",
) -> None:
    """Refuse, when the task is defined, a ``unique_on`` (or another ``option`` naming
    arguments) naming no argument of the task."""
    if unique_on is None or callable(unique_on):
        return
    if isinstance(unique_on, str) or not all(isinstance(n, str) for n in unique_on):
        raise TypeError(
            f"task {task_name!r}: {option} must be a sequence of argument names or a "
            f"function of the arguments, not {unique_on!r}"
        )
    if not unique_on:
        raise ValueError(f"task {task_name!r}: {option} names no argument")
    if sig is None:
        raise ValueError(
            f"task {task_name!r}: {option} needs a function whose arguments "
            "Python can read; give a function of the arguments instead"
        )
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in unique_on if n not in params]
    if missing:
        raise ValueError(
            f"task {task_name!r}: {option} names {missing}, which are not arguments of "
            f"the task (it takes {list(params)})"
        )


def held_key(task_name: str, key: str, unique_on: UniqueOn | None) -> str:
    """The key as the database holds it: per task name (``name:key``), so that the same key on
    two tasks names two keys, and a producer limited to some task names can hold keys of those
    tasks only (see pgtasks.grants). Keys computed from argument names carry the name already
    (see key_for)."""
    if unique_on is not None and not callable(unique_on):
        return key
    return f"{task_name}:{key}"


def key_for(
    task_name: str,
    sig: inspect.Signature | None,
    unique_on: UniqueOn,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    option: str = "unique_on",
) -> str | None:
    """The key of one call: ``task name:`` and the named arguments as json, or what the
    ``unique_on`` function returns (None: this call is not unique). ``option`` names the
    setting in errors."""
    if callable(unique_on):
        key = unique_on(*args, **kwargs)
        if key is None:
            return None
        if not isinstance(key, str):
            raise TypeError(
                f"task {task_name!r}: {option} returned {type(key).__name__}, not a string"
            )
        return key
    assert sig is not None, "argument names need the task's signature"
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"cannot enqueue {task_name}: {exc}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    for name, param in sig.parameters.items():
        if param.kind is param.VAR_KEYWORD:
            values.update(values.pop(name, {}))
    picked = {}
    for name in unique_on:
        if name not in values:
            raise ValueError(f"cannot enqueue {task_name}: {option} argument {name!r} not given")
        picked[name] = values[name]
    text = json.dumps(picked, sort_keys=True, separators=(",", ":"), default=repr)
    return f"{task_name}:{text}"
