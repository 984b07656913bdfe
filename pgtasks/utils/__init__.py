"""Helpers under the import paths Celery users already have (``celery.utils``)."""

from __future__ import annotations

import uuid as _uuid

__all__ = ["gen_unique_id", "uuid"]


def uuid() -> str:
    """A new task id: a random UUID4 as a string, as Celery's ``celery.utils.uuid``."""
    return str(_uuid.uuid4())


#: Celery's older name for :func:`uuid`.
gen_unique_id = uuid
