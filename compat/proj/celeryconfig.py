"""Settings, loaded with ``app.config_from_object("proj.celeryconfig")``."""

import os
from datetime import timedelta

from celery.schedules import crontab

broker_url = os.environ.get("COMPAT_BROKER_URL", "redis://127.0.0.1:6379/10")
result_backend = os.environ.get("COMPAT_RESULT_BACKEND", "redis://127.0.0.1:6379/11")

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
task_track_started = True
task_default_queue = "celery"
task_routes = {
    "proj.tasks.routed": {"queue": "routed"},
    "proj.limits.*": {"queue": "limits"},
}
worker_prefetch_multiplier = 1
# Redis only orders by priority with this strategy (lower number first); RabbitMQ needs
# x-max-priority on the queue (higher number first).
broker_transport_options = {"queue_order_strategy": "priority"}

# A setting of the project's own, read back by a task.
compat_marker = "loaded-from-celeryconfig"

# Periodic tasks, run by the main worker (-B).
beat_schedule = {
    "compat-every-second": {
        "task": "proj.tasks.beat_tick",
        "schedule": timedelta(seconds=1),
        "args": ("beat-every-second",),
    },
    "compat-nightly": {
        "task": "proj.tasks.beat_tick",
        "schedule": crontab(minute=30, hour=3, day_of_week="mon-fri"),
        "args": ("beat-nightly",),
    },
}
