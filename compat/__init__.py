"""Celery compatibility suite: the same scenarios under real Celery and under pgtasks."""
