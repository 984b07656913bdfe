"""Routing: which queue a task call goes to, from Celery's ``task_routes`` forms. Pure functions.

``task_routes`` may be a dict (exact names, glob patterns such as ``"proj.io.*"``, or compiled
regular expressions as keys; values ``{"queue": "io"}`` or a queue name), a router function
``(name, args, kwargs, options, task=None, **kw) -> dict | str | None``, or a list/tuple of any of
these, tried in order. The first match wins; no match means the default queue.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Router = Mapping[Any, Any] | Callable[..., Any]


def _queue_of(route: Any) -> str | None:
    if route is None:
        return None
    if isinstance(route, str):
        return route or None
    if isinstance(route, Mapping):
        queue = route.get("queue")
        if queue is None:
            return None
        name = getattr(queue, "name", queue)  # a kombu.Queue or a name
        return str(name) if name else None
    return None


def _match_mapping(routes: Mapping[Any, Any], name: str) -> str | None:
    if name in routes:
        return _queue_of(routes[name])
    for pattern, route in routes.items():
        if isinstance(pattern, re.Pattern):
            if pattern.match(name):
                return _queue_of(route)
        elif (
            isinstance(pattern, str)
            and any(c in pattern for c in "*?[")
            and fnmatch.fnmatchcase(name, pattern)
        ):
            return _queue_of(route)
    return None


def route(
    routes: Router | Sequence[Router] | None,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> str | None:
    """The queue ``task_routes`` sends a call of ``name`` to, or None for the default."""
    if routes is None:
        return None
    routers: Sequence[Any] = routes if isinstance(routes, (list, tuple)) else [routes]
    for router in routers:
        if isinstance(router, Mapping):
            queue = _match_mapping(router, name)
        elif callable(router):
            queue = _queue_of(router(name, tuple(args), dict(kwargs or {}), dict(options or {})))
        else:
            raise TypeError(
                f"task_routes entries must be dicts or functions, not {type(router).__name__}"
            )
        if queue:
            return queue
    return None
