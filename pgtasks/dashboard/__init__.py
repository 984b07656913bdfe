"""``pgtasks dashboard``: a web view of the queues, tasks, dead letters and periodic schedules,
with a JSON API (install the ``dashboard`` extra: ``pip install 'pgtasks[dashboard]'``)."""

from __future__ import annotations

from pgtasks.dashboard.app import create_app
from pgtasks.dashboard.security import UnsafeBind, WeakToken, check_bind, check_token

__all__ = ["UnsafeBind", "WeakToken", "check_bind", "check_token", "create_app"]
