"""Idempotent effects: a task run again after a failure skips the effects it already made.

pgtasks -A examples.effects.tasks worker -l INFO
python -m examples.effects.run
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgtasks import Celery

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("effects")

#: The example's own table, in pgtasks' schema.
LEDGER = sql.Identifier(app.settings.schema_name, "example_ledger")
#: Stand-in for an outside service (a mailer): what it was asked to send, by idempotency key.
RECEIPTS: dict[str, int] = {}
#: How many times settle() ran, in this process.
RUNS: list[int] = []


@app.task(bind=True, max_retries=3)
def settle(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    RUNS.append(order_id)
    # In the database: the effect's record commits with the ledger row, or not at all.
    with (
        psycopg.connect(app.database_url) as conn,
        conn.transaction(),
        self.effect("ledger", connection=conn) as first_time,
    ):
        if first_time:
            insert = sql.SQL("INSERT INTO {} (order_id) VALUES (%s)").format(LEDGER)
            conn.execute(insert, (order_id,))
    # Outside the database: the record is written when the block succeeds, and receipt.key
    # (the task id and the effect's name, the same on every run) is the mailer's idempotency key.
    with self.effect("receipt") as receipt:
        if receipt:
            RECEIPTS[receipt.key] = RECEIPTS.get(receipt.key, 0) + 1
    if self.request.retries == 0:
        # Something fails after both effects: the task runs again from the start, under the
        # same task id, and finds both done.
        raise self.retry(countdown=0, exc=TimeoutError("the payment provider timed out"))
    return f"order {order_id} settled"
