"""Start two long tasks, cancel them while they run, and show that they end REVOKED:

python -m examples.cancel.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL.
"""

from __future__ import annotations

import sys
import threading
import time

from examples.cancel.tasks import app, crawl, export
from pgtasks.migrate import migrate
from pgtasks.result import AsyncResult
from pgtasks.worker import Worker


def wait_for(result: AsyncResult, state: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.state == state:
            return True
        time.sleep(0.05)
    return False


def main() -> int:
    migrate(app.database_url, app.settings.schema_name)
    worker = Worker(app, concurrency=2, pool="threads")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        job = export.delay(10_000)  # ten minutes of work
        other = crawl.delay(10_000)
        started = wait_for(job, "STARTED") and wait_for(other, "STARTED")
        print(f"both running: {started}")
        asked = time.monotonic()
        job.abort()  # AbortableTask's call; revoke() does the same
        other.revoke()
        ended = wait_for(job, "REVOKED") and wait_for(other, "REVOKED")
        print(f"both revoked: {ended}, {time.monotonic() - asked:.1f} s after asking")
        print(f"export: {job.state}, crawl: {other.state}")
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()
    return 0 if started and ended else 1


if __name__ == "__main__":
    sys.exit(main())
