"""Enqueue limited and unlimited tasks, run them on one worker with many threads, and show from
the times each run recorded that no key ever had more runs at once than its limit, while the
unlimited tasks, sent last, did not wait for the limited ones:

python -m examples.concurrency.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from examples.concurrency.tasks import (
    app,
    export_orders,
    render_report,
    send_invoice,
    sync_customer,
    thumbnail,
)
from pgtasks import AsyncResult
from pgtasks.migrate import migrate
from pgtasks.worker import Worker

Run = dict[str, float | str]


def most_at_once(runs: list[Run]) -> int:
    """The most runs that overlapped at any moment (one ending as another starts: no overlap)."""
    events = sorted([(float(r["start"]), 1) for r in runs] + [(float(r["end"]), -1) for r in runs])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def main() -> int:
    migrate(app.database_url, app.settings.schema_name)
    limited: list[AsyncResult] = []
    # Four syncs for each of three customers: one per customer runs at a time.
    for _ in range(4):
        limited += [sync_customer.delay(customer_id) for customer_id in (1, 2, 3)]
    # The export's key is "customer:5"; these send_invoice calls take the same key per call.
    for _ in range(2):
        limited.append(export_orders.delay(5))
        limited.append(
            send_invoice.apply_async((5,), concurrency_key="customer:5", concurrency_limit=1)
        )
    # The "reports" queue runs two at a time.
    limited += [render_report.delay(region) for region in ("eu", "us", "apac", "latam")]
    # Sent last, behind all of the above: they start in the first free slots all the same.
    unlimited = [thumbnail.delay(image_id) for image_id in range(6)]
    # A row is counted under one key: a call with a limit of its own on a limited queue is refused.
    try:
        render_report.apply_async(("eu",), concurrency_key="report:eu", concurrency_limit=1)
        print("report with its own limit on the reports queue: accepted")
    except ValueError:
        print("report with its own limit on the reports queue: refused")

    Worker(app, queues=["celery", "reports"], concurrency=12, pool="threads", burst=True).run()
    by_key: dict[str, list[Run]] = defaultdict(list)
    for result in limited:
        run = result.get(timeout=10)
        by_key[str(run["key"])].append(run)
    runs = [result.get(timeout=10) for result in unlimited]

    limits = {"customer 1": 1, "customer 2": 1, "customer 3": 1, "customer:5": 1}
    limits["queue reports"] = 2
    ok = True
    for key, limit in limits.items():
        most = most_at_once(by_key[key])
        ok = ok and most <= limit
        print(f"{key}: {len(by_key[key])} runs, at most {most} at once (limit {limit})")
    first = min(float(r["start"]) for group in (*by_key.values(), runs) for r in group)
    last_limited = max(float(r["start"]) for group in by_key.values() for r in group)
    last_unlimited = max(float(r["start"]) for r in runs)
    print(
        f"unlimited: {len(runs)} runs, at most {most_at_once(runs)} at once, all started "
        f"{last_unlimited - first:.2f} s after the first run; limited runs were still starting "
        f"{last_limited - first:.2f} s after it"
    )
    held_back = last_unlimited >= last_limited
    print(f"unlimited tasks waited behind the limited ones: {held_back}")
    print(f"limits held: {ok}")
    app.close()
    return 0 if ok and not held_back else 1


if __name__ == "__main__":
    sys.exit(main())
