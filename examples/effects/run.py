"""Run a task that fails once after its effects, and show that its second run makes none again:

python -m examples.effects.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL.
"""

from __future__ import annotations

import sys

import psycopg
from psycopg import sql

from examples.effects.tasks import LEDGER, RECEIPTS, RUNS, app, settle
from pgtasks.migrate import migrate
from pgtasks.worker import Worker


def main() -> int:
    migrate(app.database_url, app.settings.schema_name)
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (order_id int)").format(LEDGER))
        conn.execute(sql.SQL("DELETE FROM {} WHERE order_id = 42").format(LEDGER))
    result = settle.delay(42)
    Worker(app, concurrency=1, pool="threads", burst=True).run()
    print(result.get(timeout=10))
    with psycopg.connect(app.database_url) as conn:
        count = sql.SQL("SELECT count(*) FROM {} WHERE order_id = 42").format(LEDGER)
        row = conn.execute(count).fetchone()
    ledger = row[0] if row else 0
    print(f"runs: {len(RUNS)}")
    print(f"ledger rows for order 42: {ledger}")
    print(f"receipts sent: {sum(RECEIPTS.values())} (key {next(iter(RECEIPTS), None)})")
    app.close()
    return 0 if (len(RUNS), ledger, sum(RECEIPTS.values())) == (2, 1, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
