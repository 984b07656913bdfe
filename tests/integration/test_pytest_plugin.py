"""The pytest plugin, run by pytest itself (pytester) on small test files that use Celery's
fixture names, against the test database."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

FUNCTION_SCOPED = """
import pytest

seen_schemas = []


@pytest.fixture(scope="session")
def celery_config():
    return {"task_default_queue": "plugin", "task_serializer": "json"}


@pytest.fixture(scope="session")
def celery_worker_parameters():
    return {"queues": ["plugin"]}


@pytest.fixture(scope="session")
def celery_includes():
    return ["plugin_tasks"]


def test_worker_runs_a_task(celery_app, celery_worker):
    @celery_app.task(name="plugin.add")
    def add(x, y):
        return x + y

    assert add.delay(2, 2).get(timeout=10) == 4
    assert celery_app.settings.default_queue == "plugin"
    assert celery_worker.pool_name == "solo"


def test_includes_are_imported_by_the_worker(celery_app, celery_worker):
    import plugin_tasks

    assert plugin_tasks.IMPORTED
    assert celery_app.send_task("plugin_tasks.mul", (6, 7)).get(timeout=10) == 42


@pytest.mark.celery(result_expires=5)
def test_marker_overrides_settings(celery_app):
    assert celery_app.settings.result_expires == 5
    assert celery_app.settings.default_queue == "plugin"


@pytest.mark.parametrize("n", [1, 2])
def test_each_test_gets_a_fresh_schema(celery_app, n):
    from pgtasks import current_app

    assert current_app() is celery_app
    schema = celery_app.settings.schema_name
    assert schema not in seen_schemas
    seen_schemas.append(schema)
    assert celery_app.broker.counts() == []
"""

PLUGIN_TASKS = """
from pgtasks import shared_task

IMPORTED = True


@shared_task(name="plugin_tasks.mul")
def mul(x, y):
    return x * y
"""

SESSION_SCOPED = """
import pytest


@pytest.fixture(scope="session")
def celery_worker_pool():
    return "threads"


def test_first(celery_session_app, celery_session_worker):
    @celery_session_app.task(name="s.double")
    def double(x):
        return 2 * x

    assert double.delay(21).get(timeout=10) == 42


def test_second_shares_the_app_and_worker(celery_session_app, celery_session_worker):
    assert "s.double" in celery_session_app.tasks
    assert celery_session_app.send_task("s.double", (5,)).get(timeout=10) == 10
    assert celery_session_worker.pool_name == "threads"
"""


@pytest.fixture
def plugin_env(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The inner run is a subprocess: the database reaches it through the environment.
    monkeypatch.setenv("PGTASKS_TEST_DSN", pg_dsn)


def test_function_scoped_fixtures(pytester: pytest.Pytester, plugin_env: None) -> None:
    pytester.makepyfile(test_plugin=FUNCTION_SCOPED, plugin_tasks=PLUGIN_TASKS)
    # Installing pgtasks registers the plugin (the pytest11 entry point): no -p needed.
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_session_scoped_fixtures(pytester: pytest.Pytester, plugin_env: None) -> None:
    pytester.makepyfile(test_session=SESSION_SCOPED)
    # Loading it by module name works too (with the entry point's copy switched off).
    result = pytester.runpytest_subprocess(
        "-p", "no:pgtasks", "-p", "pgtasks.contrib.pytest", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2)


def test_without_the_plugin_the_fixtures_do_not_exist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_missing="def test_x(celery_app):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:pgtasks")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'celery_app' not found*"])
