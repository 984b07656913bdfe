"""The ``pgtasks`` command: Celery's command shapes (``pgtasks -A proj worker``)."""

from __future__ import annotations

from pgtasks.cli.main import main

__all__ = ["main"]
