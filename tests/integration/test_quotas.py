"""Quotas: a source may have at most N waiting tasks; the rest is refused at enqueue."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgtasks import Celery, quotas
from pgtasks.exceptions import ImproperlyConfigured, QuotaExceeded
from tests.apps.harness import one


def waiting(db: psycopg.Connection[Any], source: str) -> int:
    found = one(
        db,
        "SELECT count(*) AS n FROM tasks WHERE source = %s AND status = 'PENDING'",
        (source,),
    )
    return int(found["n"])


def installed(db: psycopg.Connection[Any]) -> tuple[bool, bool]:
    """Whether the quota trigger and its index exist on this schema's task table."""
    trigger = db.execute(
        "SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = 'tasks'::regclass",
        (quotas.TRIGGER,),
    ).fetchone()
    index = db.execute(
        "SELECT 1 FROM pg_indexes WHERE indexname = %s AND schemaname = current_schema()",
        (quotas.INDEX,),
    ).fetchone()
    return trigger is not None, index is not None


@pytest.fixture
def importer(pg_dsn: str, schema: str) -> Any:
    app = Celery("importer", broker=pg_dsn, schema_name=schema, task_source="importer")

    @app.task(name="quota.work")
    def work(n: int) -> int:
        return n

    yield work
    app.close()


def test_a_source_past_its_quota_is_refused_and_nothing_is_written(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, importer: Any
) -> None:
    assert installed(db) == (False, False)  # nothing to pay for until a quota is set
    quotas.set_quota(pg_dsn, schema, "importer", 3)
    assert installed(db) == (True, True)
    importer.delay(1)
    importer.apply_many([(2,), (3,)])
    with pytest.raises(QuotaExceeded, match="importer may have at most 3 waiting tasks"):
        importer.delay(4)
    with pytest.raises(QuotaExceeded, match="pgtasks quota set importer N"):
        importer.apply_many([(5,), (6,)])  # all or nothing
    assert waiting(db, "importer") == 3
    # Other sources are not counted against it: this app's rows are its database role's.
    other = app.task(name="quota.other")(lambda: None)
    other.delay()
    role = one(db, "SELECT current_user AS r")["r"]
    assert waiting(db, role) == 1
    # Finished tasks make room.
    db.execute(
        "UPDATE tasks SET status = 'COMPLETED' WHERE source = 'importer' AND id IN"
        " (SELECT id FROM tasks WHERE source = 'importer' LIMIT 1)"
    )
    importer.delay(7)
    assert [(q.source, q.max_pending, q.waiting) for q in quotas.quotas(pg_dsn, schema)] == [
        ("importer", 3, 3)
    ]


def test_tasks_blocked_by_a_concurrency_limit_count_as_waiting(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, importer: Any
) -> None:
    quotas.set_quota(pg_dsn, schema, "importer", 2)
    first = importer.apply_async((1,), concurrency_key="one", concurrency_limit=1)
    second = importer.apply_async((2,), concurrency_key="one", concurrency_limit=1)
    claimed, taken = app.broker.claim_counting("w", ["celery"], 10, 30.0)
    assert [c.id for c in claimed] == [first.id] and taken == 2
    assert one(db, "SELECT status FROM tasks WHERE id = %s", (second.id,))["status"] == "BLOCKED"
    importer.delay(3)  # the blocked one and this one: 2 waiting
    with pytest.raises(QuotaExceeded):
        importer.delay(4)
    assert [q.waiting for q in quotas.quotas(pg_dsn, schema)] == [2]


def test_clearing_the_last_quota_removes_its_cost(
    db: psycopg.Connection[Any], pg_dsn: str, schema: str, importer: Any
) -> None:
    quotas.set_quota(pg_dsn, schema, "importer", 0)
    quotas.set_quota(pg_dsn, schema, "other", 5)
    with pytest.raises(QuotaExceeded):
        importer.delay(1)
    assert quotas.clear_quota(pg_dsn, schema, "importer") is True
    assert installed(db) == (True, True)  # "other" still has one
    importer.delay(1)
    assert quotas.clear_quota(pg_dsn, schema, "other") is True
    assert quotas.clear_quota(pg_dsn, schema, "other") is False
    assert installed(db) == (False, False)
    assert quotas.quotas(pg_dsn, schema) == []
    with pytest.raises(ValueError):
        quotas.set_quota(pg_dsn, schema, "importer", -1)


def test_a_source_name_is_checked_in_the_settings() -> None:
    app = Celery("bad", broker="postgresql://localhost/x", task_source="no spaces please")
    with pytest.raises(ImproperlyConfigured, match="task_source"):
        app.settings  # noqa: B018 - settings are read, and checked, on first use
