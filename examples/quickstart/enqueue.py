"""Create the schema and enqueue the quickstart's tasks; then start a worker to run them:

python -m examples.quickstart.enqueue
pgtasks -A examples.quickstart.tasks worker -l INFO
"""

from __future__ import annotations

from examples.quickstart.tasks import add, always_broken, app, flaky_fetch, roll, urgent
from pgtasks.migrate import migrate


def main() -> None:
    migrate(app.database_url, app.settings.schema_name)
    results = [add.delay(i, i) for i in range(5)]
    results.append(flaky_fetch.delay("https://example.org"))
    results.append(always_broken.delay(42))
    results.append(urgent.apply_async(("run me first",), priority=9))
    results.append(roll.apply_async(countdown=2))  # eta: claimed only when due
    for r in results:
        print(f"enqueued {r.id} state={r.state}")
    app.close()


if __name__ == "__main__":
    main()
