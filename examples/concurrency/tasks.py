"""Concurrency limits: at most N tasks of a key running at once, across every worker.

pgtasks -A examples.concurrency.tasks worker -Q celery,reports -P threads -c 8 -l INFO
python -m examples.concurrency.run
"""

from __future__ import annotations

import time

from pgtasks import Celery

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("concurrency")
# At most two tasks of the "reports" queue run at once, whichever tasks they are.
app.conf.update(queue_concurrency_limits={"reports": 2})

#: How long each task below works (seconds): long enough for runs to overlap when allowed.
WORK = 0.15


def _work(key: str) -> dict[str, float | str]:
    """Work for a while and say when: the key the run was limited by, its start and end."""
    start = time.time()
    time.sleep(WORK)
    return {"key": key, "start": start, "end": time.time()}


# One sync per customer at a time (the customer's API allows one session), however many
# workers and threads there are; syncs of different customers run side by side.
@app.task(concurrency_limit=1, concurrency_key=("customer_id",))
def sync_customer(customer_id: int) -> dict[str, float | str]:
    return _work(f"customer {customer_id}")


def customer_key(customer_id: int) -> str:
    """A key of our own, so that several tasks share it."""
    return f"customer:{customer_id}"


# The export and a call of send_invoice given the same key (see run.py) never overlap.
@app.task(concurrency_limit=1, concurrency_key=customer_key)
def export_orders(customer_id: int) -> dict[str, float | str]:
    return _work(customer_key(customer_id))


# Not limited itself: a call may be, with apply_async(concurrency_key=..., concurrency_limit=...).
@app.task
def send_invoice(customer_id: int) -> dict[str, float | str]:
    return _work(customer_key(customer_id))


# Limited by its queue: the queue_concurrency_limits setting above.
@app.task(queue="reports")
def render_report(region: str) -> dict[str, float | str]:
    return _work("queue reports")


# No limit at all: runs whenever a worker has a free slot.
@app.task
def thumbnail(image_id: int) -> dict[str, float | str]:
    return _work("unlimited")
