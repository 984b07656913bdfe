"""Celery's rate limit strings, and the errors for ones that make no sense."""

from __future__ import annotations

import pytest

from pgtasks import Celery
from pgtasks.config import build
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.ratelimits import admitted, interval, key, rate


@pytest.mark.parametrize(
    ("value", "per_second"),
    [
        ("10/s", 10.0),
        ("100/m", 100 / 60),
        ("2/h", 2 / 3600),
        ("0.5/s", 0.5),
        ("7", 7.0),
        (3, 3.0),
        (1.5, 1.5),
        (None, 0.0),
        ("", 0.0),
        (0, 0.0),
        ("0/m", 0.0),
    ],
)
def test_rate_accepts_celerys_forms(value: object, per_second: float) -> None:
    assert rate(value) == pytest.approx(per_second)


def test_interval_is_the_time_between_starts() -> None:
    assert interval("5/s") == pytest.approx(0.2)
    assert interval("1/m") == pytest.approx(60.0)
    assert interval(None) is None
    assert interval("0/s") is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ten/s", "use a number of tasks per second"),
        ("10/d", "the unit must be s, m or h"),
        ("-1/s", "cannot be negative"),
        (-2, "cannot be negative"),
    ],
)
def test_bad_rates_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rate(value)


def test_rate_of_a_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="rate limit must be"):
        rate([10])


def test_a_task_with_a_bad_rate_limit_fails_at_definition() -> None:
    app = Celery("limits", broker="postgresql://nowhere/db", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match=r"task 'bad\.rate': invalid rate limit"):
        app.task(name="bad.rate", rate_limit="fast")(lambda: None)
    task = app.task(name="good.rate", rate_limit="3/m")(lambda: None)
    assert task.rate_limit == "3/m"


def test_default_rate_limit_setting_is_checked() -> None:
    assert build({"task_default_rate_limit": "10/m"}).default_rate_limit == "10/m"
    assert build({"worker_disable_rate_limits": True}).disable_rate_limits is True
    with pytest.raises(ImproperlyConfigured, match="default_rate_limit"):
        build({"task_default_rate_limit": "often"})


def test_keys_and_admission() -> None:
    assert key("proj.send_email") == "task:proj.send_email"
    assert admitted({"rate_slot": "2026-01-01T00:00:00+00:00"})
    assert not admitted({"parent_id": "x"})
