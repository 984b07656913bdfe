"""The app, exactly as Celery's Django guide writes it (only the import differs)."""

from __future__ import annotations

import os

from pgtasks import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django.proj.settings")

app = Celery("proj")
# Every CELERY_* setting (CELERY_BROKER_URL -> broker_url, ...) configures the app.
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds shop/tasks.py (and every other installed app's tasks module) when the worker starts.
app.autodiscover_tasks()
