"""Settings and database URLs: Celery's names in, validated pgtasks settings out."""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from pgtasks import Celery
from pgtasks.app import normalise_dsn
from pgtasks.config import build, normalise
from pgtasks.exceptions import ImproperlyConfigured

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@pytest.fixture(autouse=True)
def _no_pgtasks_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from the defaults, whatever the environment says."""
    import os

    for key in list(os.environ):
        if key.startswith("PGTASKS_"):
            monkeypatch.delenv(key)


def make_app(**values: Any) -> Celery:
    return Celery("cfg", set_as_current=False, **values)


# -- database URLs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgres://app@db.example:5433/proj",
        "postgresql://app@db.example:5433/proj",
        "POSTGRES://app@db.example:5433/proj",
        "postgresql+psycopg://app@db.example:5433/proj",
        "postgresql+psycopg2://app@db.example:5433/proj",
        "pgtasks://app@db.example:5433/proj",
        "  postgresql://app@db.example:5433/proj\n",
    ],
)
def test_url_spellings_become_postgresql_urls(url: str) -> None:
    assert normalise_dsn(url) == "postgresql://app@db.example:5433/proj"


@settings(deadline=None)
@given(
    user=names,
    host=names,
    dbname=names,
    port=st.integers(min_value=1, max_value=65535),
    scheme=st.sampled_from(["postgres", "postgresql", "postgresql+psycopg", "pgtasks"]),
)
def test_any_accepted_scheme_means_the_same_connection(
    user: str, host: str, dbname: str, port: int, scheme: str
) -> None:
    url = normalise_dsn(f"{scheme}://{user}@{host}:{port}/{dbname}")
    assert url.startswith("postgresql://")
    assert conninfo_to_dict(url) == {
        "user": user,
        "host": host,
        "port": str(port),
        "dbname": dbname,
    }


@pytest.mark.parametrize(
    "dsn",
    ["host=localhost dbname=app", "host=/var/run/postgresql port=5432 user=app", "dbname=x"],
)
def test_libpq_strings_are_kept(dsn: str) -> None:
    assert normalise_dsn(dsn) == dsn


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("redis://localhost:6379/0", "redis"),
        ("amqp://guest@localhost//", "amqp"),
        ("sqla+postgresql://u@h/db", "sqla+postgresql"),
        ("mysql://u@h/db", "mysql"),
    ],
)
def test_other_brokers_are_refused_with_the_scheme_named(url: str, scheme: str) -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        normalise_dsn(url)
    message = str(caught.value)
    assert repr(scheme) in message
    assert "postgresql://" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://:::bad",
        "host=x port=notaport",
        "postgresql://u@h:70000/db",
        "postgresql://u@h:0/db",
        "postgresql://[::1",
        "host='unterminated",
        "postgresql://u@h/db?no_such_option=1",
        "postgresql://h:5432,h2:x/db",
    ],
)
def test_malformed_urls_are_one_line_improperly_configured(url: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="malformed database URL") as caught:
        normalise_dsn(url)
    assert "\n" not in str(caught.value)


def test_multi_host_urls_with_valid_ports_are_accepted() -> None:
    url = "postgresql://u@h1:5432,h2:5433/db"
    assert normalise_dsn(url) == url


def test_malformed_url_errors_do_not_echo_the_password() -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        normalise_dsn("postgresql://app:s3cret-pw@[::1/db")
    assert "s3cret-pw" not in str(caught.value)


def test_the_app_checks_its_url_when_it_first_needs_it() -> None:
    app = make_app(broker="redis://localhost")  # constructing never fails
    with pytest.raises(ImproperlyConfigured, match="'redis' is not supported"):
        _ = app.database_url


# -- settings ----------------------------------------------------------------------------------


def test_defaults() -> None:
    s = build({})
    assert s.database_url is None
    assert s.schema_name == "pgtasks"
    assert s.default_queue == "celery"
    assert s.accept_content == ["json"]
    assert s.task_serializer == "json"
    assert s.max_payload_bytes == 10 * 1024 * 1024


def test_celery_names_map_to_pgtasks_settings() -> None:
    app = make_app(
        broker="postgresql://h/db",
        task_default_queue="io",
        worker_concurrency=3,
        accept_content="json, pickle",
        task_default_priority=5,
    )
    s = app.settings
    assert s.database_url == "postgresql://h/db"
    assert s.default_queue == "io"
    assert s.concurrency == 3
    assert s.accept_content == ["json", "pickle"]
    assert s.default_priority == 5


def test_old_uppercase_names_are_understood() -> None:
    assert normalise({"BROKER_URL": "postgresql://h/db"}) == {"database_url": "postgresql://h/db"}


def test_unknown_names_are_kept_in_conf_and_ignored() -> None:
    app = make_app(something_celery_only=1)
    assert app.conf["something_celery_only"] == 1
    assert app.conf.something_celery_only == 1
    assert not hasattr(app.settings, "something_celery_only")


def test_settings_follow_conf_changes() -> None:
    app = make_app()
    assert app.settings.default_queue == "celery"
    app.conf.task_default_queue = "later"
    assert app.settings.default_queue == "later"
    app.conf.update(lease_seconds=7)
    assert app.settings.lease_seconds == 7


def test_environment_wins_over_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_DEFAULT_QUEUE", "from-env")
    monkeypatch.setenv("PGTASKS_DATABASE_URL", "postgresql://env-host/db")
    app = make_app(broker="postgresql://code-host/db", task_default_queue="from-code")
    assert app.settings.default_queue == "from-env"
    assert app.database_url == "postgresql://env-host/db"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("json", ["json"]),
        ("json,msgpack", ["json", "msgpack"]),
        (" json , pickle ", ["json", "pickle"]),
        ('["json", "yaml"]', ["json", "yaml"]),
    ],
)
def test_environment_lists_are_comma_separated_or_json(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: list[str]
) -> None:
    monkeypatch.setenv("PGTASKS_ACCEPT_CONTENT", value)
    assert make_app().settings.accept_content == expected


def test_malformed_environment_list_is_improperly_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGTASKS_ACCEPT_CONTENT", '["json"')
    with pytest.raises(ImproperlyConfigured, match="accept_content"):
        _ = make_app().settings


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"lease_seconds": 0.1}, "lease_seconds"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"worker_concurrency": "many"}, "concurrency"),
        ({"unknown_task_delay": -1}, "unknown_task_delay"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"task_acks_late": "sometimes"}, "acks_late"),
        ({"task_track_started": [1]}, "track_started"),
        ({"task_default_rate_limit": "often"}, "default_rate_limit"),
    ],
)
def test_invalid_settings_are_one_line_improperly_configured(
    values: dict[str, object], field: str
) -> None:
    app = make_app(**values)
    with pytest.raises(ImproperlyConfigured, match=f"invalid pgtasks setting: {field}") as caught:
        _ = app.settings
    assert "\n" not in str(caught.value)


def test_invalid_environment_value_is_improperly_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGTASKS_POLL_INTERVAL", "soon")
    with pytest.raises(ImproperlyConfigured, match="poll_interval"):
        _ = make_app().settings


def test_config_from_object_with_a_namespace() -> None:
    source = types.SimpleNamespace(
        CELERY_BROKER_URL="postgresql://ns-host/db",
        CELERY_TASK_DEFAULT_QUEUE="ns-queue",
        OTHER_SETTING="ignored",
    )
    app = make_app()
    app.config_from_object(source, namespace="CELERY")
    assert app.settings.database_url == "postgresql://ns-host/db"
    assert app.settings.default_queue == "ns-queue"
    assert "other_setting" not in app.conf


def test_config_from_object_by_module_path() -> None:
    app = make_app()
    app.config_from_object("tests.unit.test_config:SAMPLE_CONFIG")
    assert app.settings.default_queue == "from-module"


def test_config_from_missing_module() -> None:
    app = make_app()
    app.config_from_object("no_such_config_module_xyz", silent=True)
    with pytest.raises(ImportError):
        app.config_from_object("no_such_config_module_xyz")


SAMPLE_CONFIG = {"task_default_queue": "from-module"}


def test_celery_settings_without_a_broker_meaning_are_accepted() -> None:
    settings = make_app(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=True,
        timezone="Europe/Berlin",
        enable_utc=False,
    ).settings
    assert (settings.acks_late, settings.reject_on_worker_lost, settings.track_started) == (
        True,
        True,
        True,
    )
    assert (settings.timezone, settings.enable_utc) == ("Europe/Berlin", False)
