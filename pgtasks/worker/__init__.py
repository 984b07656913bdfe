"""The worker: claims tasks, runs them in a pool, finalises them with fenced statements."""

from pgtasks.worker.worker import Worker

__all__ = ["Worker"]
