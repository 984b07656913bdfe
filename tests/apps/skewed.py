"""The coordination app in a process whose clock is off.

``PGTASKS_TEST_CLOCK_OFFSET`` seconds (default 600) are added to ``time.time()`` and
``time.time_ns()`` before the app is imported, so everything the worker reads from the host's
wall clock is that far off, as on a host whose clock has drifted.
"""

from __future__ import annotations

import os
import time

_offset = float(os.environ.get("PGTASKS_TEST_CLOCK_OFFSET", "600"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset
time.time_ns = lambda: _time_ns() + int(_offset * 1e9)

from tests.apps.coord import app  # noqa: E402 - the clock is moved first

__all__ = ["app"]
