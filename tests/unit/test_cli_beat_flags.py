"""Every ``celery beat`` flag parses for ``pgtasks beat``, without starting anything."""

from __future__ import annotations

import shlex
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pgtasks import Celery
from pgtasks.cli import beat as beat_cli
from pgtasks.cli.main import cli
from pgtasks.scheduler import Scheduler


def parse(args: list[str]) -> dict[str, Any]:
    command = beat_cli.beat
    ctx = command.make_context("beat", list(args), parent=click.Context(cli))
    return dict(ctx.params)


# Each row: the arguments as a Celery user writes them, and what they parse to.
BEAT_FLAGS: list[tuple[list[str], dict[str, Any]]] = [
    (["--detach"], {"detach": True}),
    (["-s", "/var/run/celerybeat-schedule"], {"schedule_filename": "/var/run/celerybeat-schedule"}),
    (["--schedule", "beat.db"], {"schedule_filename": "beat.db"}),
    (["--schedule=beat.db"], {"schedule_filename": "beat.db"}),
    (
        ["-S", "django_celery_beat.schedulers:DatabaseScheduler"],
        {"scheduler": "django_celery_beat.schedulers:DatabaseScheduler"},
    ),
    (["--scheduler", "celery.beat:PersistentScheduler"], {"scheduler": "celery.beat:Persistent"}),
    (["--max-interval", "10"], {"max_interval": 10.0}),
    (["--max-interval=0.5"], {"max_interval": 0.5}),
    (["--enable-remote-control"], {"enable_remote_control": True}),
    (["--no-enable-remote-control"], {"enable_remote_control": False}),
    (["-n", "celerybeat@%h"], {"hostname": "celerybeat@%h"}),
    (["--hostname", "beat1"], {"hostname": "beat1"}),
    (["-l", "DEBUG"], {"loglevel": "DEBUG"}),
    (["--loglevel=info"], {"loglevel": "info"}),
    (["-f", "/tmp/beat.log"], {"logfile": "/tmp/beat.log"}),
    (["--logfile", "/tmp/%h.log"], {"logfile": "/tmp/%h.log"}),
    (["--pidfile", "/tmp/beat.pid"], {"pidfile": "/tmp/beat.pid"}),
    (["--uid", "nobody"], {"uid": "nobody"}),
    (["--gid", "nogroup"], {"gid": "nogroup"}),
    (["--umask", "022"], {"umask": "022"}),
    (["--executable", "/usr/bin/python3"], {"executable": "/usr/bin/python3"}),
    # pgtasks' own
    (["--list"], {"list_entries": True}),
    (["--list", "--json"], {"list_entries": True, "as_json": True}),
    (["--migrate"], {"migrate": True}),
    (["--log-format", "json"], {"log_format": "json"}),
]


@pytest.mark.parametrize(("args", "expected"), BEAT_FLAGS, ids=lambda v: str(v))
def test_celery_beat_flag_parses(args: list[str], expected: dict[str, Any]) -> None:
    params = parse(args)
    for key, value in expected.items():
        if key == "scheduler":
            assert params[key] == args[1]
        else:
            assert params[key] == value, (args, params)


def test_defaults() -> None:
    params = parse([])
    assert params["max_interval"] is None  # the app's beat_max_loop_interval
    assert params["loglevel"] == "INFO"
    assert params["enable_remote_control"] is None
    assert not params["detach"] and not params["list_entries"] and not params["as_json"]


def test_a_typical_celery_beat_command_line_parses_whole() -> None:
    line = (
        "--loglevel=INFO --pidfile=/var/run/celery/beat.pid --logfile=/var/log/celery/beat.log "
        "--schedule=/var/run/celery/celerybeat-schedule --max-interval 30 "
        "-S django_celery_beat.schedulers:DatabaseScheduler --uid celery --gid celery "
        "--umask 022 --executable /usr/bin/python3 --no-enable-remote-control -n beat@%h"
    )
    params = parse(shlex.split(line))
    assert params["max_interval"] == 30.0
    assert params["pidfile"] == "/var/run/celery/beat.pid"
    assert params["logfile"] == "/var/log/celery/beat.log"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_max_interval_must_be_positive_seconds(value: str) -> None:
    with pytest.raises(click.BadParameter):
        parse(["--max-interval", value])


def test_ignored_flags_stay_out_of_help() -> None:
    ctx = beat_cli.beat.make_context("beat", [], parent=click.Context(cli))
    text = beat_cli.beat.get_help(ctx)
    for hidden in (
        "--detach",
        "--schedule",
        "--scheduler",
        "--enable-remote-control",
        "--hostname",
        "--uid",
        "--gid",
        "--umask",
        "--executable",
    ):
        assert hidden not in text
    for shown in (
        "--max-interval",
        "--loglevel",
        "--logfile",
        "--pidfile",
        "--migrate",
        "--list",
        "--json",
        "Examples:",
    ):
        assert shown in text
    assert max(len(line) for line in text.splitlines()) <= 100


#: The app ``beat --list`` below reads (-A): nothing connects, its listing is given.
APP = Celery("beat-list", broker="postgresql://unused/none", set_as_current=False)


def test_the_table_lines_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timezone

    rows = [
        {
            "name": "a",
            "task": "proj.tasks.long_name",
            "schedule": "<freq: 0:00:01>",
            "last_tick": None,
            "next_tick": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
            "missed": "once",
        },
        {
            "name": "a-much-longer-name",
            "task": "t",
            "schedule": "<crontab: 0 * * * * (m/h/dM/MY/d)>",
            "last_tick": datetime(2030, 1, 2, 3, 0, tzinfo=timezone.utc),
            "next_tick": datetime(2030, 1, 2, 4, 0, tzinfo=timezone.utc),
            "missed": "skip",
        },
    ]
    monkeypatch.setattr(Scheduler, "listing", lambda self: rows)
    shown = CliRunner().invoke(cli, ["-A", f"{__name__}:APP", "beat", "--list"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].split() == [
        "NAME",
        "TASK",
        "SCHEDULE",
        "LAST",
        "TICK",
        "NEXT",
        "TICK",
        "MISSED",
    ]
    assert "2030-01-02 03:04:05 UTC" in lines[1]
    assert lines[1][lines[0].index("LAST TICK") :].startswith("- ")
    assert lines[2][lines[0].index("LAST TICK") :].startswith("2030-01-02 03:00:00 UTC")
    starts = [line.index(word) for line, word in zip(lines, ("TASK", "proj.", "t "), strict=True)]
    assert len(set(starts)) == 1, lines
