"""The project package: importing it loads the pgtasks app, as a Celery project does."""

from examples.django.proj.celery import app as celery_app

__all__ = ["celery_app"]
