"""Retention: finished rows leave with their attempt history and results once past their age,
in batches until none is left, whatever the backlog; waiting, running and dead-lettered rows
stay."""

from __future__ import annotations

from typing import Any

import psycopg

from pgtasks import Celery
from pgtasks.maintenance import Pruner


def count(db: psycopg.Connection[Any], query: str) -> int:
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_pruner_works_off_a_backlog_in_batches(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="retention.add")
    def add(x: int, y: int) -> int:
        return x + y

    results = add.apply_many([(i, i) for i in range(23)])
    with worker_factory(pool="threads", concurrency=2):
        assert [r.get(timeout=20) for r in results] == [2 * i for i in range(23)]
    waiting = add.apply_async((1, 1), countdown=3600).id
    dead = add.delay(2, 2).id
    db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", [dead])
    # Age everything on the database clock, except three finished rows.
    db.execute("UPDATE tasks SET updated_at = now() - interval '2 hours'")
    db.execute("UPDATE results SET date_done = now() - interval '2 days'")
    recent = [r.id for r in results[:3]]
    db.execute("UPDATE tasks SET updated_at = now() WHERE id = ANY(%s)", [recent])
    assert count(db, "SELECT count(*) FROM attempts") == 23

    pruner = Pruner(app.broker, task_age=3600, result_age=86400)
    pruner.BATCH = 4  # 20 aged finished rows and 23 results: several full batches
    assert pruner.run_once() == (20, 23)

    left = {r[0] for r in db.execute("SELECT id FROM tasks")}
    assert left == {*recent, waiting, dead}
    # The history goes with its rows; the kept rows keep theirs.
    history = {r[0] for r in db.execute("SELECT task_id FROM attempts")}
    assert history == set(recent)
    assert count(db, "SELECT count(*) FROM results") == 0
    assert pruner.run_once() == (0, 0)
