"""A small Celery project: the app lives in ``proj.celery``, as Celery's docs lay it out."""

from .celery import app

__all__ = ["app"]
