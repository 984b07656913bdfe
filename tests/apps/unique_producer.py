"""A producer process for the unique-task race tests.

``python -m tests.apps.unique_producer MODE KEY COUNT`` (database and schema from
``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``) connects, then waits on a shared advisory
lock the test holds, so that every producer starts at once when the test lets go; then it
enqueues ``COUNT`` calls with unique key ``KEY`` (MODE: finished, started, or a window in
seconds) and prints the ids it got back, one json list on stdout.
"""

from __future__ import annotations

import json
import os
import sys

import psycopg

from pgtasks import Celery

GATE = 7_231_001


def main() -> None:
    mode, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    app = Celery("unique-producer", broker=os.environ["PGTASKS_DATABASE_URL"])

    @app.task(name="unique.work")
    def work(n: int) -> int:
        return n

    unique_for: str | float = mode if mode in ("finished", "started") else float(mode)
    app.broker.pool.wait(timeout=30.0)
    with psycopg.connect(os.environ["PGTASKS_DATABASE_URL"], autocommit=True) as gate:
        print("ready", file=sys.stderr, flush=True)
        gate.execute("SELECT pg_advisory_lock_shared(%s)", (GATE,))
        gate.execute("SELECT pg_advisory_unlock_shared(%s)", (GATE,))
    ids = [work.apply_async((n,), unique_key=key, unique_for=unique_for).id for n in range(count)]
    print(json.dumps(ids))
    app.close()


if __name__ == "__main__":
    main()
