"""Cancelling a running task: revoke() reaches it within a second, and it stops where it chooses.

pgtasks -A examples.cancel.tasks worker -l INFO
python -m examples.cancel.run
"""

from __future__ import annotations

import time

from pgtasks import Celery
from pgtasks.contrib.abortable import AbortableTask

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("cancel")


# Celery's celery.contrib.abortable, with the same calls.
@app.task(bind=True, base=AbortableTask)
def export(self, rows: int) -> int:  # type: ignore[no-untyped-def]
    done = 0
    for _ in range(rows):
        if self.is_aborted():
            return done  # cleaned up; the task still ends REVOKED
        time.sleep(0.05)
        done += 1
    return done


# A plain task reads the same flag as self.request.cancelled.
@app.task(bind=True)
def crawl(self, pages: int) -> int:  # type: ignore[no-untyped-def]
    seen = 0
    while seen < pages and not self.request.cancelled:
        time.sleep(0.05)
        seen += 1
    return seen
