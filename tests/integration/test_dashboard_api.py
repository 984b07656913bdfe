"""The dashboard's pages and JSON API against real Postgres, through Starlette's TestClient:
what each page shows, dead-letter changes, the token and loopback rules, enqueue and status,
and escaping."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from starlette.types import ASGIApp, Receive, Scope, Send

from pgtasks import Celery
from pgtasks.cli import dashboard as dashboard_command
from pgtasks.cli.main import cli
from pgtasks.dashboard import UnsafeBind, check_bind, create_app
from pgtasks.scheduler import Scheduler
from pgtasks.worker import Worker
from tests.apps.harness import wait_until

with warnings.catch_warnings():
    # Recent Starlette releases warn that their TestClient prefers httpx2 to httpx.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
BASE = "http://127.0.0.1:5555"
XSS = "<script>alert('x')</script>"


def from_client(asgi: ASGIApp, host: str) -> ASGIApp:
    """``asgi`` as reached from the client address ``host``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "client": (host, 50000)}
        await asgi(scope, receive, send)

    return wrapped


def client(app: Celery, token: str | None = None, host: str = "127.0.0.1") -> TestClient:
    return TestClient(from_client(create_app(app, token=token), host), base_url=BASE)


def status_of(db: psycopg.Connection[Any], task_id: str) -> str | None:
    row = db.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return None if row is None else str(row[0])


@dataclass
class Made:
    worker: Worker
    ok: str
    failed: str
    dead: str
    later: str = ""


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


@pytest.fixture
def populated(app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory) -> Any:
    """A success, a failure (its error holds markup), a dead letter, a scheduled task and a
    periodic entry; the worker that ran them is still running when the block starts."""

    @app.task(name="dash.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="dash.boom")
    def boom() -> None:
        raise ValueError(XSS)

    @app.task(name="dash.doomed", autoretry_for=(KeyError,), max_retries=0)
    def doomed() -> None:
        raise KeyError("gone for good")

    app.conf.beat_schedule = {
        "dash-every-minute": {"task": "dash.add", "schedule": 60.0, "args": (1, 2)}
    }

    @contextlib.contextmanager
    def run() -> Iterator[Made]:
        with worker_factory() as worker:
            made = Made(worker, add.delay(2, 3).id, boom.delay().id, doomed.delay().id)
            for task_id, want in (
                (made.ok, "COMPLETED"),
                (made.failed, "FAILED"),
                (made.dead, "DEAD"),
            ):
                wait_until(lambda t=task_id, w=want: status_of(db, t) == w, what=f"{want}")
            made.later = add.apply_async((1, 1), countdown=3600).id
            Scheduler(app).sync()
            yield made

    return run


def test_every_page_shows_real_rows(app: Celery, populated: Any) -> None:
    with populated() as made:
        web = client(app)
        overview = web.get("/")
        assert overview.status_code == 200
        assert made.worker.id in overview.text
        assert made.failed in overview.text  # latest failures
        assert 'data-field="totals.DEAD">1<' in overview.text
        assert "<rect" in overview.text  # the throughput chart has bars

        queues = web.get("/queues")
        assert queues.status_code == 200
        assert ">celery</a>" in queues.text

        tasks = web.get("/tasks")
        assert tasks.status_code == 200
        for task_id in (made.ok, made.failed, made.dead, made.later):
            assert task_id in tasks.text
        failed = web.get("/tasks", params={"state": "failed"}).text
        assert made.failed in failed and made.ok not in failed
        by_name = web.get("/tasks", params={"name": "dash.add", "since": "1h"}).text
        assert made.ok in by_name and made.later in by_name and made.dead not in by_name
        first = web.get("/tasks", params={"limit": 2}).text
        assert first.count('href="/tasks/') == 2 and 'rel="next"' in first
        second = web.get("/tasks", params={"limit": 2, "page": 2}).text
        assert second.count('href="/tasks/') == 2 and 'rel="prev"' in second

        detail = web.get(f"/tasks/{made.ok}")
        assert detail.status_code == 200
        assert "(2, 3)" in detail.text and "SUCCESS" in detail.text
        assert "completed" in detail.text  # the attempt history
        assert made.worker.id in detail.text
        assert web.get("/tasks/no-such-task").status_code == 404

        dead = web.get("/dead-letters")
        assert dead.status_code == 200
        assert made.dead in dead.text and "gone for good" in dead.text
        assert made.failed not in dead.text

        schedules = web.get("/schedules")
        assert schedules.status_code == 200
        assert "dash-every-minute" in schedules.text and "dash.add" in schedules.text


def test_json_api(app: Celery, populated: Any) -> None:
    with populated() as made:
        web = client(app)
        overview = web.get("/api/overview").json()
        assert overview["totals"]["COMPLETED"] == 1
        assert overview["totals"]["FAILED"] == 1
        assert overview["totals"]["DEAD"] == 1
        assert overview["totals"]["PENDING"] == 1
        assert [w["id"] for w in overview["workers"]] == [made.worker.id]
        assert len(overview["throughput"]) == 60
        assert overview["finished_last_hour"] >= 3
        assert [t["id"] for t in overview["recent_failures"]] == [made.failed]

        [queue] = web.get("/api/queues").json()["queues"]
        assert (queue["queue"], queue["dead"], queue["scheduled"]) == ("celery", 1, 1)

        listed = web.get("/api/tasks", params={"state": "DEAD"}).json()
        assert [t["id"] for t in listed["tasks"]] == [made.dead]
        assert listed["has_next"] is False
        assert web.get("/api/tasks", params={"state": "nope"}).status_code == 400
        assert web.get("/api/tasks", params={"since": "yesterday"}).status_code == 400

        status = web.get(f"/api/tasks/{made.ok}").json()
        assert (status["state"], status["result"], status["ready"]) == ("SUCCESS", 5, True)
        failure = web.get(f"/api/tasks/{made.failed}").json()
        assert failure["state"] == "FAILURE"
        assert failure["result"]["type"] == "ValueError"
        assert "Traceback" in failure["traceback"]

        detail = web.get(f"/api/tasks/{made.dead}/detail").json()
        assert detail["status"] == "DEAD" and detail["argsrepr"] == "()"
        assert "payload" not in detail and "payload_raw_bytes" not in detail
        assert [a["outcome"] for a in detail["attempts"]] == ["dead"]
        assert web.get("/api/tasks/missing/detail").status_code == 404

        [letter] = web.get("/api/dead-letters").json()["dead_letters"]
        assert letter["id"] == made.dead

        [entry] = web.get("/api/schedules").json()["entries"]
        assert (entry["name"], entry["task"]) == ("dash-every-minute", "dash.add")
        assert entry["next_tick"] is not None


def test_requeue_and_discard_change_the_rows(
    app: Celery, db: psycopg.Connection[Any], populated: Any
) -> None:
    with populated() as made:
        made.worker.stop()  # nothing runs the requeued tasks
        web = client(app)
        page = web.get("/dead-letters").text
        requeued = web.post(
            "/dead-letters",
            data={"csrf": csrf_of(page), "next": "/dead-letters", "requeue_one": made.dead},
        )
        assert requeued.status_code == 200
        assert "Requeued 1 dead letter." in requeued.text
        assert status_of(db, made.dead) == "PENDING"
        history = web.get(f"/api/tasks/{made.dead}/detail").json()["attempts"]
        assert [a["outcome"] for a in history] == ["dead", "requeued"]

        # Without the form's CSRF field nothing changes.
        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (made.dead,))
        forged = web.post("/dead-letters", data={"requeue_one": made.dead})
        assert forged.status_code == 403
        assert status_of(db, made.dead) == "DEAD"

        bulk = web.post(
            "/dead-letters",
            data={"csrf": csrf_of(page), "action": "requeue_selected", "ids": [made.dead]},
        )
        assert "Requeued 1 dead letter." in bulk.text
        assert status_of(db, made.dead) == "PENDING"

        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (made.dead,))
        gone = web.post("/api/dead-letters/discard", json={"ids": [made.dead]})
        assert gone.json() == {"discarded": 1}
        assert status_of(db, made.dead) is None
        assert web.post("/api/dead-letters/requeue", json={"all": True}).json() == {"requeued": 0}
        assert web.post("/api/dead-letters/requeue", json={}).status_code == 400


def test_a_token_guards_every_page_and_change(
    app: Celery, db: psycopg.Connection[Any], populated: Any
) -> None:
    with populated() as made:
        made.worker.stop()
        # With a token, changes are accepted from any client that has it.
        web = client(app, token="s3cret", host="203.0.113.9")
        login = web.get("/", follow_redirects=False)
        assert login.status_code == 303 and login.headers["location"].startswith("/login")
        assert web.get("/api/queues").status_code == 401
        assert web.get("/static/dashboard.js").status_code == 200

        denied = web.post("/api/dead-letters/requeue", json={"ids": [made.dead]})
        assert denied.status_code == 401
        wrong = web.post(
            "/api/dead-letters/requeue",
            json={"ids": [made.dead]},
            headers={"Authorization": "Bearer nope"},
        )
        assert wrong.status_code == 401
        assert status_of(db, made.dead) == "DEAD"
        bearer = {"Authorization": "Bearer s3cret"}
        done = web.post("/api/dead-letters/requeue", json={"ids": [made.dead]}, headers=bearer)
        assert done.json() == {"requeued": 1}
        assert status_of(db, made.dead) == "PENDING"
        assert web.get("/api/queues", headers=bearer).status_code == 200

        refused = web.post("/login", data={"token": "nope", "next": "/queues"})
        assert refused.status_code == 401 and "Wrong token." in refused.text
        logged_in = web.post(
            "/login", data={"token": "s3cret", "next": "/queues"}, follow_redirects=False
        )
        assert logged_in.status_code == 303 and logged_in.headers["location"] == "/queues"
        cookie = logged_in.headers["set-cookie"]
        assert "HttpOnly" in cookie and "s3cret" not in cookie
        assert web.get("/queues").status_code == 200  # the cookie is sent from now on
        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (made.dead,))
        page = web.get("/dead-letters").text
        form = web.post("/dead-letters", data={"csrf": csrf_of(page), "requeue_one": made.dead})
        assert form.status_code == 200 and status_of(db, made.dead) == "PENDING"


def test_without_a_token_only_this_machine_may_change_anything(
    app: Celery, db: psycopg.Connection[Any], populated: Any
) -> None:
    with populated() as made:
        made.worker.stop()
        remote = client(app, host="203.0.113.9")
        assert remote.get("/dead-letters").status_code == 200  # reading is open
        refused = remote.post("/api/dead-letters/requeue", json={"ids": [made.dead]})
        assert refused.status_code == 403
        assert status_of(db, made.dead) == "DEAD"

        local = client(app)
        rebinding = local.get("/", headers={"Host": "evil.example:5555"})
        assert rebinding.status_code == 400
        cross_site = local.post(
            "/api/dead-letters/requeue",
            json={"ids": [made.dead]},
            headers={"Origin": "http://evil.example"},
        )
        assert cross_site.status_code == 403
        plain = local.post("/api/dead-letters/requeue", content=b'{"ids": []}')
        assert plain.status_code == 400  # JSON content type required
        assert status_of(db, made.dead) == "DEAD"

    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", "s3cret")
    with pytest.raises(UnsafeBind, match="--token"):
        check_bind("0.0.0.0", None)
    assert dashboard_command.dashboard.name == "dashboard"  # registered on import
    result = CliRunner().invoke(cli, ["dashboard", "--address", "0.0.0.0"], env={})
    assert result.exit_code == 2
    assert "refusing to serve the dashboard on 0.0.0.0 without a token" in result.output


def test_enqueue_and_status_round_trip(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="dash.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    web = client(app)
    with worker_factory():
        sent = web.post("/api/tasks", json={"task": "dash.mul", "args": [6, 7]})
        assert sent.status_code == 202
        task_id = sent.json()["id"]
        final = wait_until(
            lambda: (s := web.get(f"/api/tasks/{task_id}").json())["ready"] and s,
            what="the task's result",
        )
        assert (final["state"], final["result"], final["successful"]) == ("SUCCESS", 42, True)

    later = web.post(
        "/api/tasks",
        json={"task": "dash.mul", "kwargs": {"x": 1, "y": 2}, "countdown": 600, "queue": "io"},
    ).json()["id"]
    row = db.execute(
        "SELECT queue, run_at > now() + interval '500 seconds' FROM tasks WHERE id = %s",
        (later,),
    ).fetchone()
    assert row == ("io", True)
    assert web.get(f"/api/tasks/{later}").json()["state"] == "PENDING"
    for bad in ({"args": [1]}, {"task": "dash.mul", "args": {}}, {"task": "x", "countdown": -1}):
        answer = web.post("/api/tasks", json=bad)
        assert answer.status_code == 400 and answer.json()["error"]
    assert web.post("/api/tasks", json={"task": "x", "nope": 1}).status_code == 400


def test_markup_in_names_and_errors_is_escaped(app: Celery, populated: Any) -> None:
    with populated() as made:
        app.send_task(XSS, queue=XSS)
        web = client(app)
        pages = [
            web.get("/").text,
            web.get("/tasks").text,
            web.get("/queues").text,
            web.get(f"/tasks/{made.failed}").text,
        ]
        for page in pages:
            assert XSS not in page
            assert "<script>alert" not in page
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in pages[1]  # the name
        assert "&lt;script&gt;" in pages[3]  # the error
        headers = web.get("/").headers
        assert "script-src 'self'" in headers["content-security-policy"]
