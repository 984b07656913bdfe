"""The Django fix-up against real PostgreSQL: settings from ``django.conf:settings``, lazy task
discovery, task rows that commit or roll back with ``atomic()``, ``delay_on_commit``, connections
closed around tasks, and the example project run as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtasks import Celery

django = pytest.importorskip("django", reason="Django is not installed (pip install django)")

from django.conf import settings  # noqa: E402  (only once Django is known to be installed)

from pgtasks.contrib import django as fixup  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Rollback(Exception):
    """Raised to roll an ``atomic()`` block back."""


@pytest.fixture(scope="module")
def django_db(pg_dsn: str) -> Iterator[None]:
    """Django configured in this process for this module only, on the test database.

    Django's settings and app registry are process-wide: both are reset afterwards so no other
    test module sees a configured Django.
    """
    from django.apps import apps
    from django.db import connections
    from django.utils.functional import empty

    if settings.configured:
        pytest.skip("Django is already configured in this process by another test")
    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    settings.configure(
        SECRET_KEY="tests",
        USE_TZ=True,
        INSTALLED_APPS=["examples.django.shop"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname", "postgres"),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
                "CONN_MAX_AGE": 0,
            }
        },
        CELERY_BROKER_URL=pg_dsn,
        CELERY_TASK_DEFAULT_QUEUE="from-django",
        CELERY_ACCEPT_CONTENT=["json", "yaml"],
        BROKER_POOL_LIMIT=5,  # not CELERY_*: must be ignored under the namespace
    )
    django.setup()
    try:
        yield
    finally:
        connections.close_all()
        connections.__dict__.pop("settings", None)
        settings._wrapped = empty
        apps.app_configs = {}
        apps.apps_ready = apps.models_ready = apps.ready = apps.loading = False
        apps.clear_cache()


@pytest.fixture
def dj_app(django_db: None, app: Celery) -> Celery:
    """The test app with the Django fix-up installed."""
    fixup.install(app)
    return app


@pytest.fixture
def add(dj_app: Celery) -> Any:
    @dj_app.task(name="dj.add")
    def add(x: int, y: int) -> int:
        return x + y

    return add


def exists(db: psycopg.Connection[Any], task_id: str) -> bool:
    row = db.execute("SELECT 1 FROM tasks WHERE id = %s", [task_id]).fetchone()
    return row is not None


def test_config_from_django_settings_with_the_celery_namespace(django_db: None) -> None:
    app = Celery("dj", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    assert app.conf["broker_url"] == settings.CELERY_BROKER_URL
    assert app.settings.default_queue == "from-django"
    assert app.settings.accept_content == ["json", "yaml"]
    assert "broker_pool_limit" not in app.conf and "pool_limit" not in app.conf
    assert "secret_key" not in app.conf


def test_autodiscover_without_arguments_is_lazy_and_finds_installed_apps(dj_app: Celery) -> None:
    dj_app.autodiscover_tasks()
    assert "examples.django.shop.tasks.send_receipt" not in dj_app.tasks
    dj_app.import_includes()  # what a worker does when it starts
    assert "examples.django.shop.tasks.send_receipt" in dj_app.registered()


def test_a_task_enqueued_in_a_rolled_back_atomic_block_never_exists(
    add: Any, db: psycopg.Connection[Any]
) -> None:
    from django.db import transaction

    with pytest.raises(Rollback), transaction.atomic():
        doomed = add.delay(1, 1)
        assert not exists(db, doomed.id)  # uncommitted: invisible to every other session
        raise Rollback
    assert not exists(db, doomed.id)


def test_a_task_enqueued_in_a_committed_atomic_block_runs(
    add: Any, db: psycopg.Connection[Any], worker_factory
) -> None:
    from django.db import transaction

    with transaction.atomic():
        kept = add.delay(2, 3)
        assert not exists(db, kept.id)
    assert exists(db, kept.id)
    with worker_factory():
        assert kept.get(timeout=10) == 5


def test_a_savepoint_rolled_back_inside_a_committed_block(
    add: Any, db: psycopg.Connection[Any]
) -> None:
    from django.db import transaction

    with transaction.atomic():
        outer = add.delay(1, 1)
        with pytest.raises(Rollback), transaction.atomic():
            inner = add.delay(2, 2)
            raise Rollback
    assert exists(db, outer.id)
    assert not exists(db, inner.id)


def test_outside_atomic_the_row_is_committed_at_once(add: Any, db: psycopg.Connection[Any]) -> None:
    assert exists(db, add.delay(1, 2).id)


def test_delay_on_commit_enqueues_only_after_the_commit(
    add: Any, db: psycopg.Connection[Any]
) -> None:
    from django.db import transaction

    def names() -> list[tuple[Any, ...]]:
        return db.execute("SELECT payload::text FROM tasks ORDER BY created_at").fetchall()

    with pytest.raises(Rollback), transaction.atomic():
        assert add.delay_on_commit(10, 10) is None
        raise Rollback
    assert names() == []
    with transaction.atomic():
        add.apply_async_on_commit((20, 20), countdown=0)
        assert names() == []
    assert len(names()) == 1
    add.delay_on_commit(30, 30)  # no transaction open: enqueued at once
    assert len(names()) == 2


def test_database_connections_are_closed_around_each_task(dj_app: Celery, worker_factory) -> None:
    from django.db import connection

    seen: list[int] = []
    lock = threading.Lock()

    @dj_app.task(name="dj.backend")
    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        with lock:
            seen.append(pid)
        return int(pid)

    @dj_app.task(name="dj.leaks_a_transaction")
    def leaks_a_transaction() -> bool:
        connection.set_autocommit(False)  # a task that forgets to restore autocommit
        return True

    with worker_factory(pool="solo"):
        first = backend.delay().get(timeout=10)
        assert leaks_a_transaction.delay().get(timeout=10) is True
        second = backend.delay().get(timeout=10)
    # CONN_MAX_AGE=0: each task starts on a new session, and a session left outside autocommit
    # is never handed to the next task.
    assert first != second
    assert seen == [first, second]


def test_a_django_wrapper_binds_like_a_connection(
    add: Any, dj_app: Celery, db: psycopg.Connection[Any]
) -> None:
    from django.db import connection, transaction

    with pytest.raises(Rollback), transaction.atomic(), dj_app.transaction(connection):
        doomed = add.delay(1, 1)
        raise Rollback
    assert not exists(db, doomed.id)


def test_the_example_project_runs(pg_dsn: str, schema: str, db: psycopg.Connection[Any]) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": pg_dsn,
        "PGTASKS_EXAMPLE_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "examples.django.run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rolled back: PENDING" in proc.stdout
    assert "committed: receipt for order 2 (4)" in proc.stdout
    rows = db.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall()
    assert rows == [("COMPLETED", 2)]  # the committed delay and the delay_on_commit


def test_a_prefork_child_leaves_the_parents_connection_alone(
    dj_app: Celery, worker_factory
) -> None:
    from django.db import connection

    @dj_app.task(name="dj.child_backend")
    def child_backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def backend_here() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    parent = backend_here()  # open before the fork: the child inherits this socket
    with worker_factory(pool="prefork", concurrency=1):
        child = child_backend.delay().get(timeout=10)
    assert child != parent
    # Had the child closed the inherited connection, this session would be gone.
    assert backend_here() == parent


def test_an_effect_in_an_atomic_block_commits_or_rolls_back_with_it(
    dj_app: Celery, db: psycopg.Connection[Any]
) -> None:
    from django.db import transaction

    from pgtasks.request import Request

    @dj_app.task(name="dj.pay", bind=True)
    def pay(self: Any) -> None:
        pass

    def recorded() -> int:
        row = db.execute("SELECT count(*) FROM effects").fetchone()
        return int(row[0]) if row else 0

    pay.push_request(Request(id="dj-effect"))
    try:
        with pytest.raises(Rollback), transaction.atomic():
            with pay.effect("charge") as effect:
                assert effect.first_time
            raise Rollback
        assert recorded() == 0  # rolled back with the block
        with transaction.atomic(), pay.effect("charge") as effect:
            assert effect.first_time
            assert recorded() == 0  # not committed yet
        assert recorded() == 1
        with transaction.atomic(), pay.effect("charge") as effect:
            assert not effect.first_time
        with pay.effect("charge") as effect:  # outside atomic(): the database is asked
            assert not effect.first_time
    finally:
        pay.pop_request()
