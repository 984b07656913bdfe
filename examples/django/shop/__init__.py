"""A Django app with a ``tasks`` module, found by ``app.autodiscover_tasks()``."""
