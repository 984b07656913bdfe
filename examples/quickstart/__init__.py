"""Quickstart: a Celery-style app on PostgreSQL (an embedded one when none is configured)."""
