"""Call the FastAPI example's endpoints with a worker running beside them, and print what they
answer:

python -m examples.fastapi.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL.
"""

from __future__ import annotations

import sys

from fastapi.testclient import TestClient

from examples.fastapi.app import api, app
from pgtasks.contrib.testing import start_worker
from pgtasks.migrate import migrate


def main() -> int:
    migrate(app.database_url, app.settings.schema_name)
    with TestClient(api) as client:
        # No worker yet: the first report waits, so the second click finds it.
        first = client.post("/reports/eu").json()
        again = client.post("/reports/eu").json()
        print(f"POST /reports/eu twice -> same task: {first['id'] == again['id']}")
        with start_worker(app, pool="asyncio", concurrency=10):
            added = client.post("/add", params={"a": 2, "b": 3}).json()
            print(f"POST /add?a=2&b=3 -> {added}")
            report = app.AsyncResult(first["id"]).get(timeout=10)
            print(f"report: {report}")
    app.close()
    ok = added["result"] == 5 and report == "report for eu" and first["id"] == again["id"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
