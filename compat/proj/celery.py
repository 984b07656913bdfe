"""The app factory."""

import os

from celery import Celery

#: Every task module. ``COMPAT_INCLUDE`` narrows the list to the modules that import cleanly,
#: so one missing feature does not keep the worker from starting.
TASK_MODULES = [
    "proj.tasks",
    "proj.retrying",
    "proj.hooks",
    "proj.canvas_tasks",
    "proj.signal_handlers",
    "proj.limits",
    "proj.logs",
    "proj.shared",
]


def create_app(name: str = "proj") -> Celery:
    include = os.environ.get("COMPAT_INCLUDE")
    app = Celery(name, include=include.split(",") if include else TASK_MODULES)
    app.config_from_object("proj.celeryconfig")
    return app


app = create_app()
