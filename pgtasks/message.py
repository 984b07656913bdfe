"""The immutable envelopes that travel between the API, the broker and the worker.

``TaskMessage`` is one enqueued call as its row will hold it; ``ClaimedTask`` is a row a worker
has claimed. Header names follow Celery's message protocol v2 where Celery has one.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgtasks.serialization import Encoded, Unreadable


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(unsafe_hash=True)
class TaskMessage:
    """One call of a task, ready to be written as a row."""

    id: str
    name: str
    queue: str
    priority: int
    body: Encoded
    headers: dict[str, Any] = field(default_factory=dict)
    eta: datetime | None = None
    countdown: float | None = None
    expires_at: datetime | None = None
    expires_in: float | None = None
    max_retries: int | None = None
    #: A unique call's key and how long it is held (see pgtasks.unique); None: not unique.
    unique: Unique | None = None

    @property
    def unique_key(self) -> str | None:
        return self.unique.key if self.unique is not None else None


@dataclass(frozen=True)
class Unique:
    """A unique call's key, held for ``window`` seconds from the first enqueue, else by the
    task's status: while it waits or runs, or (``until_started``) until first claimed."""

    key: str
    window: float | None = None
    until_started: bool = False


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(slots=True, unsafe_hash=True)
class ClaimedTask:
    """A row this worker owns until its lease runs out: ``(id, attempt)`` is the fencing token."""

    id: str
    name: str
    queue: str
    priority: int
    attempt: int
    retries: int
    max_retries: int | None
    content_type: str
    content_encoding: str
    payload: str | None
    payload_raw: bytes | None
    headers: dict[str, Any]
    run_at: datetime
    expires_at: datetime | None
    expired: bool
    created_at: datetime
    #: The attempt a dead-letter requeue started from (0 if never requeued): workers lost
    #: before it do not count against the task's budget any more.
    requeued_attempt: int = 0
    #: Not claimed, never run: set BLOCKED by the claim (its concurrency limit is full), or
    #: left PENDING until its rate-limit start time. None for a claimed row.
    set_aside: str | None = None

    @property
    def body(self) -> bytes | str:
        """The serialized ``[args, kwargs]`` whichever column holds it."""
        if self.payload is not None:
            return self.payload
        return self.payload_raw or b""


# -- rows as written -------------------------------------------------------------------------

#: The reasons ``malformed`` gives (a dead-lettered row's metric label).
MALFORMED_HEADERS = "malformed headers"
OVERSIZE_PAYLOAD = "oversize payload"

_NONE = type(None)
#: The headers the worker reads itself, and the JSON types each may hold (as Celery's message
#: protocol writes them). Anyone who may insert a row writes its headers: one of another type
#: dead-letters the row before it runs, rather than failing (or being read as something else)
#: wherever it is first used.
_HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "argsrepr": (str, _NONE),
    "kwargsrepr": (str, _NONE),
    "ignore_result": (bool, _NONE),
    "result_serializer": (str, _NONE),
    "parent_id": (str, _NONE),
    "root_id": (str, _NONE),
    "group": (str, _NONE),
    "timelimit": (list, _NONE),  # and see _limits
    # kombu's header for a compressed body (Celery's compression= option). pgtasks stores
    # bodies as they are and never writes it: a body said to be compressed is refused unread,
    # and no decompressor ever runs on what a row holds.
    "compression": (_NONE,),
}
#: What an error says each of _HEADER_TYPES must be.
_HEADER_SHAPES = {
    "ignore_result": "a boolean or null",
    "timelimit": "[hard, soft]: two numbers of seconds or nulls",
    "compression": "absent: compressed payloads are not supported",
}

#: JSON's name for what a json value loads as, for error messages.
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    _NONE: "null",
}

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


def malformed(row: ClaimedTask, max_bytes: int) -> tuple[str, str] | None:
    """Why a claimed row cannot run as written, as ``(reason, error)``; None for a row that
    can. Its headers must be a JSON object, each header the worker reads of its type, and its
    payload no more than ``max_bytes`` (max_payload_bytes, which enqueue holds every payload
    to). Checked before anything decodes the payload; for every claimed row, so the common
    case costs a few comparisons."""
    headers = row.headers
    if type(headers) is not dict:
        if isinstance(headers, Unreadable):
            return MALFORMED_HEADERS, f"cannot decode headers: {headers.error}"
        found = _json_type(headers)
        return MALFORMED_HEADERS, f"cannot decode headers: a JSON object is required, not {found}"
    text = row.payload
    # A character of the json text is one to four bytes in UTF-8: a short text is no more.
    if row.payload_raw is not None or (text is not None and 4 * len(text) > max_bytes):
        size = _payload_bytes(row)
        if size > max_bytes:
            return OVERSIZE_PAYLOAD, (
                f"cannot decode payload: {size} bytes, over the {max_bytes}-byte limit "
                "(max_payload_bytes)"
            )
    for key, value in headers.items():
        kinds = _HEADER_TYPES.get(key)
        if kinds is not None and type(value) not in kinds:
            return _wrong_header(key, _json_type(value))
    if "timelimit" in headers and not _limits(headers["timelimit"]):
        return _wrong_header("timelimit", _short.repr(headers["timelimit"]))
    return None


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _wrong_header(key: str, found: str) -> tuple[str, str]:
    shape = _HEADER_SHAPES.get(key, "a string or null")
    return MALFORMED_HEADERS, f"cannot decode headers: {key!r} must be {shape}, not {found}"


def _limits(value: list[Any] | None) -> bool:
    """Whether a ``timelimit`` header reads as Celery writes it: [hard, soft], null or numbers."""
    return value is None or (len(value) == 2 and all(type(v) in (int, float, _NONE) for v in value))


def _payload_bytes(row: ClaimedTask) -> int:
    """The size of a row's payload as stored, in bytes."""
    size = 0 if row.payload_raw is None else len(row.payload_raw)
    if row.payload is not None:
        size += len(row.payload.encode("utf-8", "surrogatepass"))
    return size
