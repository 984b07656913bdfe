"""Configuration: config_from_object, app.conf."""

import itertools

from scenarios import WAIT, outcome, scenario


@scenario("app.conf and config_from_object")
def config_from_object(obs):
    """Settings loaded from ``proj.celeryconfig`` are visible in the caller and in the worker."""
    from proj.celery import app
    from proj.tasks import config_value

    obs["caller"] = {
        "task_default_queue": app.conf.task_default_queue,
        "task_serializer": app.conf.task_serializer,
        "compat_marker": app.conf.get("compat_marker"),
    }
    obs["worker"] = outcome(lambda: config_value.delay("compat_marker").get(timeout=WAIT))
    app.conf.update(compat_updated="yes")
    obs["updated"] = app.conf.get("compat_updated")


@scenario("app.conf and config_from_object")
def current_app_proxy(obs):
    """``from celery import current_app``: the app, usable as ``current_app.conf``."""
    from celery import current_app

    from proj.celery import app

    obs["conf"] = outcome(lambda: current_app.conf.task_default_queue)
    obs["main"] = outcome(lambda: current_app.main)
    obs["is_project_app"] = outcome(lambda: current_app._get_current_object() is app)


@scenario("app.control")
def control_ping(obs):
    """``app.control.ping(timeout=1)`` gets a reply from the running workers."""
    from proj.celery import app

    replies = outcome(lambda: app.control.ping(timeout=1.0))
    if "value" in replies:
        obs["replied"] = isinstance(replies["value"], list) and len(replies["value"]) >= 1
        obs["info"] = {"replies": len(replies["value"])}
    else:
        obs["replied"] = replies


@scenario("beat_schedule")
def beat_schedule(obs):
    """A ``beat_schedule`` entry every second (the worker runs with ``-B``): it keeps running,
    about a second apart; a weekday crontab entry is accepted alongside it."""
    from proj import journal

    start = len(journal.read("beat-every-second"))
    times = sorted(journal.wait("beat-every-second", start + 3, timeout=6))[start:]
    obs["ran_three_more_times"] = len(times) >= 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    obs["about_a_second_apart"] = bool(gaps) and all(0.5 <= g <= 1.6 for g in gaps)
    obs["info"] = {"gaps": [round(g, 2) for g in gaps]}
