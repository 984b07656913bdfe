"""Unique tasks: a second enqueue of a held key returns the task that holds it.

pgtasks -A examples.unique.tasks worker -l INFO
python -m examples.unique.run
"""

from __future__ import annotations

from datetime import timedelta

from pgtasks import Celery

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("unique")


# One sync per customer waits or runs at a time: a click on "sync" while one is queued or
# running gets that one's result handle instead of a second sync.
@app.task(unique_on=("customer_id",))
def sync_customer(customer_id: int, full: bool = False) -> str:
    return f"synced customer {customer_id}{' (full)' if full else ''}"


# At most one reminder per invoice every ten minutes, however often it is asked for and
# whether or not the last one has been sent already.
@app.task(unique_on=("invoice_id",), unique_for=timedelta(minutes=10))
def remind(invoice_id: int) -> str:
    return f"reminded about invoice {invoice_id}"
