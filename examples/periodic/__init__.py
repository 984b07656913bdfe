"""Periodic tasks: Celery's ``beat_schedule``, run by every worker started with ``-B``."""
