"""pytest fixtures with Celery's names, on a real PostgreSQL.

Enable with ``-p pgtasks.contrib.pytest`` (or ``pytest_plugins = ["pgtasks.contrib.pytest"]``).
Tests written against ``celery.contrib.pytest`` keep working:

- ``celery_config`` (session): settings for the test app; override it in a conftest;
  ``@pytest.mark.celery(**overrides)`` adds per-test settings.
- ``celery_parameters`` (session): keyword arguments for the ``Celery(...)`` constructor.
- ``celery_includes`` (session): modules the worker imports before it starts.
- ``celery_worker_pool`` (session, ``"solo"``) and ``celery_worker_parameters`` (session):
  the worker's pool and its other ``Worker`` arguments.
- ``celery_app``: an app on a fresh, migrated schema of the test database, current for the test.
- ``celery_worker``: a worker of ``celery_app`` in a thread, stopped when the test ends.
- ``celery_session_app`` / ``celery_session_worker``: the same, for the whole session.

The database comes from ``celery_database_url`` (session): ``PGTASKS_TEST_DSN``, else a Docker
PostgreSQL, else an embedded one (see ``pgtasks.contrib.testing``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from pgtasks import app as app_module
from pgtasks.app import Celery
from pgtasks.contrib import testing
from pgtasks.worker import Worker


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``celery`` marker, so ``--strict-markers`` accepts it."""
    config.addinivalue_line(
        "markers", "celery(**overrides): override pgtasks/Celery settings for one test"
    )


@contextlib.contextmanager
def _create_app(
    dsn: str, config: Mapping[str, Any], parameters: Mapping[str, Any]
) -> Iterator[Celery]:
    """An app on a fresh schema, current while the block runs (the previous one restored)."""
    previous = app_module._current
    with testing.fresh_schema(dsn, config.get("schema_name")) as schema:
        settings = {**testing.FAST_SETTINGS, "broker_url": dsn, **config, "schema_name": schema}
        params = dict(parameters)
        main = params.pop("main", "celery.tests")
        app = Celery(main, **params)
        app.conf.update(settings)
        try:
            yield app
        finally:
            app.close()
            app_module._current = previous


def _import(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)


@pytest.fixture(scope="session")
def celery_database_url() -> Iterator[str]:
    """The PostgreSQL URL the test apps use (one server for the session)."""
    with testing.database_url() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def celery_config() -> Mapping[str, Any]:
    """Override to configure the test app (Celery or pgtasks setting names)."""
    return {}


@pytest.fixture(scope="session")
def celery_parameters() -> Mapping[str, Any]:
    """Override to pass keyword arguments to the test app's ``Celery(...)`` constructor."""
    return {}


@pytest.fixture(scope="session")
def celery_includes() -> Sequence[str]:
    """Override with modules (of tasks, of signal handlers) the worker imports first."""
    return ()


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    """Override to choose the test worker's pool (``solo``, ``threads``, ``prefork``)."""
    return "solo"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    """Override to pass other ``Worker`` arguments (``queues``, ``concurrency``, ...)."""
    return {}


@pytest.fixture(scope="session")
def celery_enable_logging() -> bool:
    """Accepted for compatibility: pgtasks logs through structlog either way."""
    return False


@pytest.fixture(scope="session")
def use_celery_app_trap() -> bool:
    """Accepted for compatibility: pgtasks has no default-app trap."""
    return False


@pytest.fixture
def celery_app(
    request: pytest.FixtureRequest,
    celery_database_url: str,
    celery_config: Mapping[str, Any],
    celery_parameters: Mapping[str, Any],
) -> Iterator[Celery]:
    """An app on a fresh schema of the test database, current for the test."""
    mark = request.node.get_closest_marker("celery")
    config = {**celery_config, **(mark.kwargs if mark else {})}
    with _create_app(celery_database_url, config, celery_parameters) as app:
        yield app


@pytest.fixture
def celery_worker(
    celery_app: Celery,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: Mapping[str, Any],
) -> Iterator[Worker]:
    """A worker of ``celery_app`` running in a thread until the test ends."""
    _import(celery_includes)
    with testing.start_worker(
        celery_app, pool=celery_worker_pool, **celery_worker_parameters
    ) as worker:
        yield worker


@pytest.fixture(scope="session")
def celery_session_app(
    celery_database_url: str,
    celery_config: Mapping[str, Any],
    celery_parameters: Mapping[str, Any],
) -> Iterator[Celery]:
    """An app on a fresh schema shared by the whole session."""
    with _create_app(celery_database_url, celery_config, celery_parameters) as app:
        yield app


@pytest.fixture(scope="session")
def celery_session_worker(
    celery_session_app: Celery,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: Mapping[str, Any],
) -> Iterator[Worker]:
    """A worker of ``celery_session_app`` running for the whole session."""
    _import(celery_includes)
    with testing.start_worker(
        celery_session_app, pool=celery_worker_pool, **celery_worker_parameters
    ) as worker:
        yield worker


@pytest.fixture
def depends_on_current_app(celery_app: Celery) -> None:
    """Make ``celery_app`` the current app (it already is, as in Celery's default set-up)."""
    app_module._current = celery_app
