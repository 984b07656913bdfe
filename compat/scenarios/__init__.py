"""Named scenarios: each enqueues work, waits with bounded timeouts and records what the caller
observes. Imports of the task library happen inside the scenario functions, so a missing feature
fails only the scenarios that use it.
"""

import datetime
import importlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

MODULES = [
    "scenarios.calling",
    "scenarios.request",
    "scenarios.errors",
    "scenarios.retries",
    "scenarios.results",
    "scenarios.serialization",
    "scenarios.hooks",
    "scenarios.canvas",
    "scenarios.limits",
    "scenarios.config",
    "scenarios.cli",
]

#: Seconds any single wait may take.
WAIT = 10.0

REGISTRY: dict[str, dict[str, Any]] = {}

#: Task ids and the scenarios' tokens: different on every run, so replaced by ``<id>``.
_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{32}\b", re.I
)

#: Long decimals in messages (elapsed times) are rounded to one place.
_FLOAT = re.compile(r"\d+\.\d{4,}")


def _text(text: str) -> str:
    text = _UUID.sub("<id>", text)
    return _FLOAT.sub(lambda m: f"{float(m.group()):.1f}", text)


def scenario(
    feature: str,
    note: str = "",
    timeout: float = 30.0,
    differs: dict[str, str] | None = None,
) -> Callable[..., Any]:
    """Register a scenario under ``feature`` (a row of COMPAT.md). ``note`` explains choices
    that the observations alone do not (what is compared and what is not). ``differs`` names
    the observations where pgtasks deliberately does otherwise than Celery, each with the
    reason (documented in docs/migrating-from-celery.md): both values are recorded untouched
    and shown side by side as a documented difference, and every other observation must
    match."""

    def decorator(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        REGISTRY[fn.__name__] = {
            "name": fn.__name__,
            "feature": feature,
            "doc": " ".join((fn.__doc__ or "").split()),
            "note": note,
            "differs": dict(differs or {}),
            "timeout": timeout,
            "fn": fn,
        }
        return fn

    return decorator


def load_all() -> dict[str, dict[str, Any]]:
    for module in MODULES:
        importlib.import_module(module)
    return REGISTRY


def token() -> str:
    return uuid.uuid4().hex


def clean(value: Any) -> Any:
    """Normalised JSON: tuples as lists, exceptions as {type, message}, task ids as ``<id>``,
    long decimals in text rounded."""
    if isinstance(value, BaseException):
        return exc(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return {"__type__": type(value).__name__, "iso": value.isoformat()}
    return {"__type__": type(value).__name__, "repr": _text(repr(value))}


def exc(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "message": _text(str(e))}


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": ...}`` or ``{"raised": {type, message}}``."""
    try:
        return {"value": clean(fn())}
    except Exception as e:
        return {"raised": exc(e)}


def wait_state(result: Any, wanted: set[str], timeout: float = WAIT) -> str:
    """Poll ``result.state`` until it is one of ``wanted``; the last state seen otherwise."""
    deadline = time.monotonic() + timeout
    state = result.state
    while state not in wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        state = result.state
    return state
