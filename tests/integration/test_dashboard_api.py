"""The dashboard's pages and JSON API against real Postgres, through Starlette's TestClient:
what each page shows, dead-letter changes, the token and loopback rules, enqueue and status,
and escaping."""

from __future__ import annotations

import contextlib
import html
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
from tests.integration.test_ops_queries import ago, insert

with warnings.catch_warnings():
    # Recent Starlette releases warn that their TestClient prefers httpx2 to httpx.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
BASE = "http://127.0.0.1:5555"
XSS = "<script>alert('x')</script>"
TOKEN = "dashboard-token-for-the-tests-0123"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def from_client(asgi: ASGIApp, host: str) -> ASGIApp:
    """``asgi`` as reached from the client address ``host``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "client": (host, 50000)}
        await asgi(scope, receive, send)

    return wrapped


def client(app: Celery, token: str | None = None, host: str = "127.0.0.1") -> TestClient:
    return TestClient(from_client(create_app(app, token=token), host), base_url=BASE)


def browser(app: Celery) -> TestClient:
    """A browser logged in to a dashboard with a token."""
    web = client(app, token=TOKEN)
    answer = web.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert answer.status_code == 303
    return web


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
        web = browser(app)
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

        selected = {"csrf": csrf_of(page), "action": "requeue_selected", "ids": [made.dead]}
        asked = web.post("/dead-letters", data=selected)
        assert "Requeue the 1 selected dead letter?" in asked.text
        assert status_of(db, made.dead) == "DEAD"  # not before it is confirmed
        bulk = web.post("/dead-letters", data={**selected, "confirmed": "yes"})
        assert "Requeued 1 dead letter." in bulk.text
        assert status_of(db, made.dead) == "PENDING"

        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (made.dead,))
        api = client(app, token=TOKEN)
        gone = api.post("/api/dead-letters/discard", json={"ids": [made.dead]}, headers=BEARER)
        assert gone.json() == {"discarded": 1}
        assert status_of(db, made.dead) is None
        everything = api.post("/api/dead-letters/requeue", json={"all": True}, headers=BEARER)
        assert everything.json() == {"requeued": 0}
        assert api.post("/api/dead-letters/requeue", json={}, headers=BEARER).status_code == 400


def test_a_token_guards_every_page_and_change(
    app: Celery, db: psycopg.Connection[Any], populated: Any
) -> None:
    with populated() as made:
        made.worker.stop()
        # With a token, changes are accepted from any client that has it.
        web = client(app, token=TOKEN, host="203.0.113.9")
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
        bearer = BEARER
        done = web.post("/api/dead-letters/requeue", json={"ids": [made.dead]}, headers=bearer)
        assert done.json() == {"requeued": 1}
        assert status_of(db, made.dead) == "PENDING"
        assert web.get("/api/queues", headers=bearer).status_code == 200

        refused = web.post("/login", data={"token": "nope", "next": "/queues"})
        assert refused.status_code == 401 and "Wrong token." in refused.text
        logged_in = web.post(
            "/login", data={"token": TOKEN, "next": "/queues"}, follow_redirects=False
        )
        assert logged_in.status_code == 303 and logged_in.headers["location"] == "/queues"
        cookie = logged_in.headers["set-cookie"]
        assert "HttpOnly" in cookie and TOKEN not in cookie
        assert web.get("/queues").status_code == 200  # the cookie is sent from now on
        db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (made.dead,))
        page = web.get("/dead-letters").text
        form = web.post("/dead-letters", data={"csrf": csrf_of(page), "requeue_one": made.dead})
        assert form.status_code == 200 and status_of(db, made.dead) == "PENDING"


def test_without_a_token_nothing_changes_and_only_this_machine_reads(
    app: Celery, db: psycopg.Connection[Any], populated: Any
) -> None:
    with populated() as made:
        made.worker.stop()
        for host in ("203.0.113.9", "127.0.0.1"):
            web = client(app, host=host)
            assert web.get("/dead-letters").status_code == 200  # reading is open
            refused = web.post("/api/dead-letters/requeue", json={"ids": [made.dead]})
            assert refused.status_code == 403 and "read-only" in refused.json()["error"]
        assert status_of(db, made.dead) == "DEAD"

        rebinding = client(app).get("/", headers={"Host": "evil.example:5555"})
        assert rebinding.status_code == 400

        web = browser(app)
        cross_site = web.post(
            "/api/dead-letters/requeue",
            json={"ids": [made.dead]},
            headers={"Origin": "http://evil.example"},
        )
        assert cross_site.status_code == 403
        plain = web.post("/api/dead-letters/requeue", content=b'{"ids": []}', headers=BEARER)
        assert plain.status_code == 400  # JSON content type required
        assert status_of(db, made.dead) == "DEAD"

    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(UnsafeBind, match="PGTASKS_DASHBOARD_TOKEN"):
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

    web = client(app, token=TOKEN)
    web.headers.update(BEARER)
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


# -- bulk actions act on what they showed -------------------------------------------------------


def hidden_fields(page: str, form_id: str | None = None, **more: Any) -> dict[str, Any]:
    """The hidden inputs of the page's form (``form_id``), or of its confirmation form, with
    ``more`` fields."""
    pattern = rf'<form[^>]*id="{form_id}"' if form_id else r'<form[^>]*class="confirm"'
    found = re.search(pattern + r".*?</form>", page, re.S)
    assert found, "no such form on the page"
    fields: dict[str, Any] = {}
    for name, value in re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)">', found[0]
    ):
        fields.setdefault(html.unescape(name), []).append(html.unescape(value))
    return {**fields, **more}


def dead_by(db: psycopg.Connection[Any]) -> dict[tuple[str, str, str], int]:
    rows = db.execute("SELECT name, queue, status, count(*) FROM tasks GROUP BY 1, 2, 3")
    return {(n, q, s): c for n, q, s, c in rows.fetchall()}


@pytest.fixture
def many_dead(db: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """45 dead letters: proj.add 11 (celery), proj.mul 26 (18 celery, 8 io), proj.sub 8 (io)."""
    made: dict[str, list[str]] = {}
    n = 0
    for name, queue, count in (
        ("proj.add", "celery", 11),
        ("proj.mul", "celery", 18),
        ("proj.mul", "io", 8),
        ("proj.sub", "io", 8),
    ):
        for _ in range(count):
            n += 1
            made.setdefault(f"{name}@{queue}", []).append(
                insert(db, "DEAD", name=name, queue=queue, error="boom", updated_at=ago(600 + n))
            )
    return made


def test_discard_all_on_a_filtered_page_discards_only_the_filtered_rows(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    web = browser(app)
    page = web.get("/dead-letters", params={"task": "proj.add"}).text
    assert page.count("<tr data-id=") == 11
    form = hidden_fields(page, "dead-form", action="discard_all")
    assert form["task"] == ["proj.add"]  # the form carries the page's filter

    asked = web.post("/dead-letters", data=form)
    assert asked.status_code == 200
    assert "Discard 11 dead letters of task proj.add? This cannot be undone." in asked.text
    assert asked.text.count("<tr data-id=") == 11
    assert sum(dead_by(db).values()) == 45  # nothing yet

    done = web.post("/dead-letters", data=hidden_fields(asked.text))
    assert "Discarded 11 dead letters of task proj.add." in done.text
    assert dead_by(db) == {
        ("proj.mul", "celery", "DEAD"): 18,
        ("proj.mul", "io", "DEAD"): 8,
        ("proj.sub", "io", "DEAD"): 8,
    }


def test_requeue_all_on_a_page_filtered_by_task_and_queue(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    web = browser(app)
    page = web.get("/dead-letters", params={"task": "proj.mul", "queue": "io"}).text
    assert page.count("<tr data-id=") == 8
    asked = web.post("/dead-letters", data=hidden_fields(page, "dead-form", action="requeue_all"))
    assert "Requeue 8 dead letters of task proj.mul in queue io?" in asked.text
    done = web.post("/dead-letters", data=hidden_fields(asked.text))
    assert "Requeued 8 dead letters of task proj.mul in queue io." in done.text
    assert dead_by(db)[("proj.mul", "io", "PENDING")] == 8
    assert ("proj.mul", "io", "DEAD") not in dead_by(db)
    assert sum(c for (_, _, s), c in dead_by(db).items() if s == "DEAD") == 37


def test_a_bulk_action_never_acts_on_more_than_it_showed(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    web = browser(app)
    page = web.get("/dead-letters", params={"queue": "io"}).text
    asked = web.post("/dead-letters", data=hidden_fields(page, "dead-form", action="discard_all"))
    assert "Discard 16 dead letters in queue io?" in asked.text
    confirm = hidden_fields(asked.text)

    # While the operator reads: one more task dies in that queue, and someone else requeues
    # one of the sixteen.
    newcomer = insert(db, "DEAD", name="proj.sub", queue="io", error="late")
    taken = many_dead["proj.sub@io"][0]
    db.execute("UPDATE tasks SET status = 'PENDING' WHERE id = %s", (taken,))

    done = web.post("/dead-letters", data=confirm)
    assert (
        "Discarded 15 dead letters in queue io. 1 of the 16 shown was no longer a dead letter."
        in done.text
    )
    assert status_of(db, newcomer) == "DEAD" and status_of(db, taken) == "PENDING"


def test_a_bulk_action_refuses_when_more_match_than_it_showed(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    web = browser(app)
    page = web.get("/dead-letters", params={"task": "proj.add"}).text
    asked = web.post("/dead-letters", data=hidden_fields(page, "dead-form", action="requeue_all"))
    assert "Requeue 11 dead letters of task proj.add?" in asked.text
    # A row dead-lettered before the page was read but committed after it (its time is
    # older than the newest shown): it is part of the set now, which is larger than shown.
    late = insert(db, "DEAD", name="proj.add", error="late", updated_at=ago(10_000))
    refused = web.post("/dead-letters", data=hidden_fields(asked.text))
    assert refused.status_code == 409
    assert "12 match now where 11 were shown. Nothing was changed" in refused.text
    assert "Requeue 12 dead letters of task proj.add?" in refused.text  # asked again
    assert dead_by(db)[("proj.add", "celery", "DEAD")] == 12
    done = web.post("/dead-letters", data=hidden_fields(refused.text))
    assert "Requeued 12 dead letters of task proj.add." in done.text
    assert status_of(db, late) == "PENDING"


def test_bulk_actions_on_nothing_and_on_selected_rows(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    web = browser(app)
    page = web.get("/dead-letters", params={"task": "proj.none"}).text
    asked = web.post("/dead-letters", data=hidden_fields(page, "dead-form", action="discard_all"))
    assert "No dead letters of task proj.none: nothing to discard." in asked.text
    assert 'class="confirm"' not in asked.text

    two = many_dead["proj.sub@io"][:2]
    page = web.get("/dead-letters").text
    chosen = hidden_fields(page, "dead-form", action="discard_selected", ids=two)
    asked = web.post("/dead-letters", data=chosen)
    assert "Discard the 2 selected dead letters? This cannot be undone." in asked.text
    done = web.post("/dead-letters", data=hidden_fields(asked.text))
    assert "Discarded 2 dead letters." in done.text
    assert [status_of(db, i) for i in two] == [None, None]
    assert sum(dead_by(db).values()) == 43
    row = re.search(rf'<tr data-id="{many_dead["proj.add@celery"][0]}">.*?</tr>', page)
    assert (
        row
        and f'data-confirm="Discard dead letter {many_dead["proj.add@celery"][0]} of task proj.add?'
        in row[0]
    )


def test_the_api_acts_on_its_filter_and_refuses_past_what_was_seen(
    app: Celery, db: psycopg.Connection[Any], many_dead: dict[str, list[str]]
) -> None:
    api = client(app, token=TOKEN)
    api.headers.update(BEARER)
    requeued = api.post(
        "/api/dead-letters/requeue", json={"all": True, "task": "proj.mul", "queue": "io"}
    )
    assert requeued.json() == {"requeued": 8}
    assert dead_by(db)[("proj.mul", "io", "PENDING")] == 8

    too_many = api.post(
        "/api/dead-letters/discard", json={"all": True, "task": "proj.add", "expect": 10}
    )
    assert too_many.status_code == 409 and too_many.json()["matching"] == 11
    assert dead_by(db)[("proj.add", "celery", "DEAD")] == 11
    seen = api.post("/api/dead-letters/discard", json={"all": True, "queue": "io", "expect": 8})
    assert seen.json() == {"discarded": 8}
    assert ("proj.sub", "io", "DEAD") not in dead_by(db)

    for bad in (
        {"ids": many_dead["proj.add@celery"][:1], "queue": "io"},
        {"all": True, "expect": -1},
        {"all": True, "queue": ""},
    ):
        assert api.post("/api/dead-letters/requeue", json=bad).status_code == 400
