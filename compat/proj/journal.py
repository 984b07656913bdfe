"""An append-only log shared by the caller and the worker: tasks note what ran, in what order.

One JSON line per event in the file named by ``COMPAT_JOURNAL``; nothing here depends on the
task library.
"""

import json
import os
import time
from typing import Any


def _path() -> str:
    return os.environ.get("COMPAT_JOURNAL", "/tmp/compat-journal.jsonl")


def note(key: str, value: Any) -> None:
    line = json.dumps({"key": key, "value": value, "t": time.time()}, default=repr) + "\n"
    fd = os.open(_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(key: str) -> list[Any]:
    try:
        with open(_path()) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event["key"] == key:
            out.append(event["value"])
    return out


def wait(key: str, count: int, timeout: float = 10.0) -> list[Any]:
    """The events for ``key`` once there are ``count`` of them (or whatever is there at timeout)."""
    deadline = time.monotonic() + timeout
    events = read(key)
    while len(events) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        events = read(key)
    return events
