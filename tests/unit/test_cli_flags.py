"""Every ``celery worker`` (and ``status``/``inspect``/``call``/``result``) flag parses.

The flags are parsed by click exactly as the command line would, without starting anything.
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path
from typing import Any

import click
import pytest
from structlog.testing import capture_logs

from pgtasks.cli import commands, control
from pgtasks.cli.main import cli
from pgtasks.cli.worker_flags import CeleryWorkerFlags, create_pidfile, node_format


def parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    ctx = command.make_context(command.name, list(args), parent=click.Context(cli))
    return dict(ctx.params)


# Each row: the arguments as a Celery user writes them, and what they parse to.
WORKER_FLAGS: list[tuple[list[str], dict[str, Any]]] = [
    (["-c", "4"], {"concurrency": 4}),
    (["--concurrency=4"], {"concurrency": 4}),
    (["-P", "solo"], {"pool": "solo"}),
    (["--pool", "threads"], {"pool": "threads"}),
    (["-Q", "a,b"], {"queues": "a,b"}),
    (["--queues=a"], {"queues": "a"}),
    (["-X", "b"], {"exclude_queues": "b"}),
    (["--exclude-queues", "b,c"], {"exclude_queues": "b,c"}),
    (["-I", "proj.tasks"], {"include": "proj.tasks"}),
    (["--include", "a,b"], {"include": "a,b"}),
    (["-l", "DEBUG"], {"loglevel": "DEBUG"}),
    (["--loglevel=info"], {"loglevel": "info"}),
    (["-n", "w1@%h"], {"worker_id": "w1@%h"}),
    (["--hostname", "w1"], {"worker_id": "w1"}),
    (["-D"], {"detach": True}),
    (["--detach"], {"detach": True}),
    (["-S", "/tmp/state"], {"statedb": "/tmp/state"}),
    (["--statedb", "/tmp/state"], {"statedb": "/tmp/state"}),
    (["-O", "fair"], {"optimization": "fair"}),
    (["-Ofair"], {"optimization": "fair"}),
    (["--prefetch-multiplier", "4"], {"prefetch_multiplier": 4}),
    (["--disable-prefetch"], {"disable_prefetch": True}),
    (["-E"], {"task_events": True}),
    (["--task-events"], {"task_events": True}),
    (["--events"], {"task_events": True}),
    (["--time-limit", "30"], {"time_limit": 30.0}),
    (["--soft-time-limit", "2.5"], {"soft_time_limit": 2.5}),
    (["--max-tasks-per-child", "10"], {"max_tasks_per_child": 10}),
    (["--max-memory-per-child", "12000"], {"max_memory_per_child": 12000}),
    (["--purge"], {"purge": True}),
    (["--discard"], {"purge": True}),
    (["--without-gossip"], {"without_gossip": True}),
    (["--without-mingle"], {"without_mingle": True}),
    (["--without-heartbeat"], {"without_heartbeat": True}),
    (["--heartbeat-interval", "5"], {"heartbeat_interval": 5}),
    (["--autoscale", "10,3"], {"autoscale": "10,3"}),
    (["-B"], {"beat": True}),
    (["--beat"], {"beat": True}),
    (["-s", "/tmp/beat"], {"schedule_filename": "/tmp/beat"}),
    (["--schedule-filename", "/tmp/beat"], {"schedule_filename": "/tmp/beat"}),
    (["--schedule", "/tmp/beat"], {"schedule_filename": "/tmp/beat"}),
    (["--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"], {"scheduler": "x"}),
    (["-f", "/tmp/w.log"], {"logfile": "/tmp/w.log"}),
    (["--logfile", "/tmp/%n.log"], {"logfile": "/tmp/%n.log"}),
    (["--pidfile", "/tmp/%n.pid"], {"pidfile": "/tmp/%n.pid"}),
    (["--uid", "nobody"], {"uid": "nobody"}),
    (["--gid", "nogroup"], {"gid": "nogroup"}),
    (["--umask", "022"], {"umask": "022"}),
    (["--executable", "/usr/bin/python3"], {"executable": "/usr/bin/python3"}),
]


@pytest.mark.parametrize(("args", "expected"), WORKER_FLAGS, ids=lambda v: str(v))
def test_celery_worker_flag_parses(args: list[str], expected: dict[str, Any]) -> None:
    params = parse(commands.worker, args)
    for key, value in expected.items():
        if key == "scheduler":
            assert params[key] == args[1]
        else:
            assert params[key] == value, (args, params)


def test_a_typical_celery_command_line_parses_whole() -> None:
    line = (
        "--loglevel=INFO --concurrency=8 --max-tasks-per-child=100 --pidfile=/tmp/%n.pid "
        "--logfile=/tmp/%n%I.log -Q celery,default --task-events --without-gossip "
        "--without-heartbeat --without-mingle -Ofair -B -E --statedb=worker.state -s beat "
        "--time-limit=300 --soft-time-limit=240 -n worker1@%h"
    )
    args = shlex.split(line)
    params = parse(commands.worker, args)
    assert params["concurrency"] == 8
    assert params["time_limit"] == 300.0
    assert params["soft_time_limit"] == 240.0


def test_ignored_flags_stay_out_of_help() -> None:
    ctx = commands.worker.make_context("worker", [], parent=click.Context(cli))
    text = commands.worker.get_help(ctx)
    for hidden in ("--without-gossip", "--statedb", "--uid", "--autoscale", "--detach"):
        assert hidden not in text
    for shown in (
        "--time-limit",
        "--soft-time-limit",
        "--max-tasks-per-child",
        "--pidfile",
        "--beat",
    ):
        assert shown in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (control.status, ["-t", "5", "-d", "a,b", "-j"], {"as_json": True, "destination": "a,b"}),
        (control.status, ["--timeout", "2", "--json"], {"timeout": 2.0, "as_json": True}),
        (control.inspect, ["active", "-t", "1", "--destination", "w1"], {"action": "active"}),
        (control.inspect, ["registered", "-j"], {"action": "registered"}),
        (control.inspect, ["stats"], {"action": "stats"}),
        (control.inspect, ["ping"], {"action": "ping"}),
        (control.inspect, ["scheduled"], {"action": "scheduled"}),
        (control.inspect, ["reserved"], {"action": "reserved"}),
        (control.inspect, ["active_queues"], {"action": "active_queues"}),
        (
            control.call,
            ["t.add", "-a", "[1, 2]", "-k", '{"x": 1}', "--countdown", "5", "--queue", "q"],
            {"args": [1, 2], "kwargs": {"x": 1}, "countdown": 5.0, "queue": "q"},
        ),
        (
            control.call,
            ["t.add", "--args=[1]", "--kwargs={}", "--expires", "60", "--serializer", "json"],
            {"args": [1], "expires": 60.0},
        ),
        (
            control.call,
            ["t.add", "--eta", "2030-01-02T03:04:05", "--exchange", "x", "--routing-key", "q"],
            {"routing_key": "q"},
        ),
        (control.call, ["t.add", "--priority", "7"], {"priority": 7}),
        (control.result, ["abc", "--traceback"], {"show_traceback": True}),
        (control.result, ["abc", "-t", "tasks.add"], {"task": "tasks.add"}),
    ],
)
def test_control_flags_parse(
    command: click.Command, args: list[str], expected: dict[str, Any]
) -> None:
    params = parse(command, args)
    for key, value in expected.items():
        assert params[key] == value, params


def test_call_eta_is_utc_when_naive() -> None:
    params = parse(control.call, ["t.add", "--eta", "2030-01-02T03:04:05"])
    assert params["eta"].isoformat() == "2030-01-02T03:04:05+00:00"


@pytest.mark.parametrize(
    "args", [["t", "-a", "{}"], ["t", "-k", "[]"], ["t", "-a", "nope"], ["t", "--eta", "soon"]]
)
def test_call_rejects_bad_values(args: list[str]) -> None:
    with pytest.raises(click.BadParameter):
        parse(control.call, args)


def test_detach_is_refused_with_a_pointer() -> None:
    with pytest.raises(click.UsageError, match="supervisor"):
        CeleryWorkerFlags(detach=True)


def test_autoscale_runs_its_maximum() -> None:
    assert CeleryWorkerFlags(autoscale="10,3").concurrency(None) == 10
    assert CeleryWorkerFlags(autoscale="10,3").concurrency(4) == 4
    with pytest.raises(click.BadParameter):
        CeleryWorkerFlags(autoscale="ten")


def test_exclude_queues() -> None:
    flags = CeleryWorkerFlags(exclude_queues="b, c")
    assert flags.queues(["a", "b", "c"], "celery") == ["a"]
    assert flags.queues(None, "celery") == ["celery"]
    with pytest.raises(click.UsageError):
        flags.queues(["b"], "celery")
    assert CeleryWorkerFlags().queues(None, "celery") is None


def test_worker_options() -> None:
    flags = CeleryWorkerFlags(
        time_limit=3.0, soft_time_limit=1.0, max_tasks_per_child=5, max_memory_per_child=200_000
    )
    assert flags.worker_options() == {
        "time_limit": 3.0,
        "soft_time_limit": 1.0,
        "max_tasks_per_child": 5,
        "max_memory_per_child": 200_000,
    }


def test_max_memory_per_child_is_a_flag_of_its_own() -> None:
    ctx = commands.worker.make_context("worker", [], parent=click.Context(cli))
    assert "--max-memory-per-child" in commands.worker.get_help(ctx)
    assert parse(commands.worker, ["--max-memory-per-child", "0"])["max_memory_per_child"] == 0
    with pytest.raises(click.BadParameter):
        parse(commands.worker, ["--max-memory-per-child", "-5"])
    # Enforced now, so no longer named among the flags that are ignored.
    with (
        capture_logs() as logs,
        CeleryWorkerFlags(max_memory_per_child=1000).session(None, None, False, None),
    ):
        pass
    assert [e for e in logs if e["event"] == "worker.flags_ignored"] == []


def test_node_format() -> None:
    host = socket.gethostname()
    assert node_format("/tmp/%h.pid") == f"/tmp/{host}.pid"
    assert node_format("/tmp/%n%I.log", "w1") == "/tmp/w1.log"
    assert node_format("100%%") == "100%"


def test_pidfile_refuses_a_live_process_and_replaces_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    path.write_text(f"{os.getppid()}\n")
    with pytest.raises(click.ClickException, match="already exists"):
        create_pidfile(str(path))
    path.write_text("999999999\n")  # no such process
    create_pidfile(str(path))
    assert path.read_text().strip() == str(os.getpid())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-A", "proj", "-b", "postgresql://x/y"], {"app_spec": "proj", "broker": "x"}),
        (["--workdir", "/tmp"], {"workdir": "/tmp"}),
        (["--config", "proj.settings"], {"config_module": "proj.settings"}),
        (["-q"], {"quiet": True}),
        (["--quiet"], {"quiet": True}),
        (["--result-backend", "redis://"], {"result_backend": "redis://"}),
        (["--loader", "default"], {"loader": "default"}),
        (["-C"], {"no_color": True}),
        (["--no-color"], {"no_color": True}),
        (["--skip-checks"], {"skip_checks": True}),
    ],
)
def test_celery_global_flags_parse(args: list[str], expected: dict[str, Any]) -> None:
    parser = cli.make_parser(click.Context(cli))
    params, _, _ = parser.parse_args([*args, "status"])
    for key, value in expected.items():
        if key == "broker":
            assert params[key] == args[3]
        else:
            assert params[key] == value, params


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-f"], {"force": True}),
        (["-Q", "a,b"], {"queues": "a,b"}),
        (["-X", "b"], {"exclude_queues": "b"}),
        (["--exclude-queues", "b"], {"exclude_queues": "b"}),
    ],
)
def test_celery_purge_flags_parse(args: list[str], expected: dict[str, Any]) -> None:
    params = parse(commands.purge, args)
    for key, value in expected.items():
        assert params[key] == value
