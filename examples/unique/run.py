"""Enqueue duplicates, show that they come back as the first task, run them, and show that the
key is free again once its task has finished:

python -m examples.unique.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL.
"""

from __future__ import annotations

import sys

from examples.unique.tasks import app, remind, sync_customer
from pgtasks.migrate import migrate
from pgtasks.worker import Worker


def main() -> int:
    migrate(app.database_url, app.settings.schema_name)
    first = sync_customer.delay(42)
    again = sync_customer.delay(42, full=True)  # same customer: the first one's handle
    other = sync_customer.delay(7)
    print(f"sync 42: {first.id}\nsync 42 again: {again.id} (same task: {again.id == first.id})")
    print(f"sync 7: {other.id}")
    # Keys can also be given per call, whatever the task's options.
    a = sync_customer.apply_async((1,), unique_key="nightly-sync")
    b = sync_customer.apply_async((2,), unique_key="nightly-sync")
    print(f"nightly-sync twice: same task: {a.id == b.id}")
    r1, r2 = remind.delay(9), remind.delay(9)
    print(f"remind 9 twice: same task: {r1.id == r2.id}")

    Worker(app, concurrency=2, pool="threads", burst=True).run()
    print(first.get(timeout=10))
    print(other.get(timeout=10))
    print(r1.get(timeout=10))
    # Finished: the next sync of customer 42 is a new task. The reminder's window still holds.
    later = sync_customer.delay(42)
    print(f"sync 42 after it ran: new task: {later.id != first.id}")
    print(f"remind 9 after it ran: same task: {remind.delay(9).id == r1.id}")
    ok = again.id == first.id and a.id == b.id and r1.id == r2.id and later.id != first.id
    app.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
