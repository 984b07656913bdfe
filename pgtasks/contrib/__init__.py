"""Integrations: Django (``contrib.django``), pytest fixtures (``contrib.pytest``) and the
test-database helpers they share (``contrib.testing``). Nothing here is imported by the core."""
