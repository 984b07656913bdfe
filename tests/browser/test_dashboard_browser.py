"""The dashboard in a real browser: Debian's Chromium driven by Playwright against a dashboard
served by uvicorn on a schema holding real tasks. Every page is loaded, checked and saved as a
full-page screenshot under ``test-artifacts/screenshots/``; a dead letter is requeued by
clicking its button, the bulk buttons of a filtered page are clicked and confirmed (they must
change exactly the rows shown), a dashboard without a token is checked to offer no change, and
the page's live updates are watched arriving.

Skipped when Chromium (``/usr/bin/chromium``) or Playwright is missing, except in CI
(``CI=true``), where that is a failure: the browser tests must not be skipped silently there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

CHROMIUM = Path("/usr/bin/chromium")


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser tests cannot run in CI: {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import uvicorn  # noqa: E402
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright  # noqa: E402

from pgtasks import Celery  # noqa: E402
from pgtasks.dashboard import create_app  # noqa: E402
from pgtasks.scheduler import Scheduler  # noqa: E402
from pgtasks.worker import Worker  # noqa: E402
from tests.apps.harness import REPO, wait_until  # noqa: E402
from tests.integration.test_ops_queries import ago, insert  # noqa: E402

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
TOKEN = "dashboard-token-for-the-browser-tests"
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture
def problems() -> list[str]:
    """What the browser reported as errors (a test may remove those it expects)."""
    return []


@pytest.fixture
def page(browser: Browser, problems: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(10_000)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    tab.on("console", on_console)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    try:
        yield tab
        # A script error or a Content-Security-Policy violation shows up here.
        assert problems == [], f"the browser reported errors: {problems}"
    finally:
        context.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Celery, token: str | None = None) -> Iterator[str]:
    """The dashboard of ``app`` served by uvicorn in a thread; yields its base URL."""
    port = free_port()
    web = create_app(app, token=token, poll_seconds=0.5)
    config = uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=10, what="the dashboard to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def log_in(page: Page, base: str) -> None:
    page.goto(base + "/login")
    page.fill('input[name="token"]', TOKEN)
    page.click("form.login button")
    page.wait_for_url(base + "/")


def shoot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def status_of(db: psycopg.Connection[Any], task_id: str) -> str | None:
    row = db.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return None if row is None else str(row[0])


class Clock:
    """A scheduler clock that starts two minutes back, so the first pass enqueues a tick."""

    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc) - timedelta(minutes=2)

    def __call__(self) -> datetime:
        return self.now


def populate(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> dict[str, str]:
    """Successes, a failure, a dead letter (in queue ``io``, which the browsing worker does not
    consume), a scheduled task and a periodic entry with a tick behind it."""

    @app.task(name="shop.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="shop.charge")
    def charge(order: int) -> None:
        raise ValueError(f"card declined for order {order}")

    @app.task(name="shop.sync_stock", autoretry_for=(ConnectionError,), max_retries=0)
    def sync_stock() -> None:
        raise ConnectionError("warehouse API unreachable")

    app.conf.beat_schedule = {
        "stock-every-minute": {"task": "shop.add", "schedule": 60.0, "args": (1, 1)},
    }
    with worker_factory(queues=["celery", "io"]):
        oks = [add.delay(i, i) for i in range(12)]
        failed = charge.delay(1042).id
        dead = sync_stock.apply_async(queue="io").id
        for result in oks:
            result.get(timeout=20)
        wait_until(lambda: status_of(db, failed) == "FAILED", what="the failure")
        wait_until(lambda: status_of(db, dead) == "DEAD", what="the dead letter")
    scheduled = add.apply_async((5, 5), countdown=3600).id
    clock = Clock()
    beat = Scheduler(app, now=clock)
    beat.sync()
    clock.now += timedelta(minutes=2)
    beat.tick()
    return {"ok": oks[0].id, "failed": failed, "dead": dead, "scheduled": scheduled}


def test_every_page_in_chromium(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, page: Page
) -> None:
    made = populate(app, db, worker_factory)
    shots = []
    with serve(app, token=TOKEN) as base, worker_factory(queues=["celery"]) as worker:
        log_in(page, base)
        page.goto(base + "/")
        assert page.locator('[data-field="totals.DEAD"]').inner_text() == "1"
        page.locator("#workers", has_text=worker.id).wait_for()
        assert page.locator("#failures").inner_text().count("card declined") == 1
        assert page.locator("#throughput rect").count() >= 1
        page.locator("#live", has_text="live ·").wait_for()  # the first poll came back
        shots.append(shoot(page, "overview"))

        page.goto(base + "/queues")
        rows = page.locator("#queues tr")
        assert rows.count() == 2  # celery and io
        assert "io" in rows.nth(1).inner_text()
        shots.append(shoot(page, "queues"))

        page.goto(base + "/tasks")
        table = page.locator("#tasks")
        for task_id in made.values():
            assert task_id in table.inner_text()
        fresh = app.send_task("shop.add", (20, 22), countdown=600).id
        page.locator("#tasks", has_text=fresh).wait_for()  # arrived by a poll, no reload
        shots.append(shoot(page, "tasks"))

        page.select_option('select[name="state"]', "FAILED")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/tasks?state=FAILED*")
        assert page.locator("#tasks tr").count() == 1
        page.click(f'a[href="/tasks/{made["failed"]}"]')
        page.wait_for_url(f"**/tasks/{made['failed']}")
        assert "(1042,)" in page.locator("dl.fields").inner_text()
        assert "FAILURE" in page.locator('[data-field="state"]').inner_text()
        assert "card declined" in page.locator("pre.traceback").inner_text()
        assert page.locator("#attempts tr").count() == 1
        shots.append(shoot(page, "task-detail"))

        page.goto(base + "/schedules")
        entry = page.locator("#schedules tr", has_text="stock-every-minute")
        cells = entry.locator("td")
        assert cells.nth(1).inner_text() == "shop.add"
        assert cells.nth(3).inner_text() != "-"  # last tick
        assert cells.nth(4).inner_text() != "-"  # next tick
        shots.append(shoot(page, "schedules"))

        page.goto(base + "/dead-letters")
        row = page.locator(f'#dead-letters tr[data-id="{made["dead"]}"]')
        assert "warehouse API unreachable" in row.inner_text()
        shots.append(shoot(page, "dead-letters"))
        row.get_by_role("button", name="Requeue").click()
        page.locator(".flash", has_text="Requeued 1 dead letter.").wait_for()
        wait_until(lambda: status_of(db, made["dead"]) == "PENDING", timeout=10, what="the requeue")
        assert page.locator("#dead-letters tr.empty").count() == 1
        shots.append(shoot(page, "dead-letters-requeued"))
    for shot in shots:
        assert shot.stat().st_size > 0


def test_login_with_a_token(
    app: Celery,
    db: psycopg.Connection[Any],
    worker_factory: WorkerFactory,
    page: Page,
    problems: list[str],
) -> None:
    populate(app, db, worker_factory)
    with serve(app, token=TOKEN) as base:
        page.goto(base + "/queues")
        page.wait_for_url("**/login?next=*")
        page.fill('input[name="token"]', "wrong")
        page.click("form.login button")
        page.get_by_role("alert").wait_for()
        # The refused login answers 401, which the browser reports.
        problems[:] = [p for p in problems if "status of 401" not in p]
        shoot(page, "login")
        page.fill('input[name="token"]', TOKEN)
        page.click("form.login button")
        page.wait_for_url(base + "/queues")
        assert page.locator("#queues tr").count() == 2
        page.locator("#live", has_text="live ·").wait_for()  # polls carry the cookie
        cookies = page.context.cookies()
        assert [c["httpOnly"] for c in cookies] == [True]
        page.click("form.logout button")
        page.wait_for_url("**/login")
        page.goto(base + "/queues")  # the session ended with the logout
        page.wait_for_url("**/login?next=*")


def dead_counts(db: psycopg.Connection[Any]) -> dict[tuple[str, str, str], int]:
    rows = db.execute("SELECT name, queue, status, count(*) FROM tasks GROUP BY 1, 2, 3")
    return {(n, q, s): c for n, q, s, c in rows.fetchall()}


def test_bulk_buttons_change_exactly_the_rows_of_the_filtered_page(
    app: Celery, db: psycopg.Connection[Any], page: Page
) -> None:
    """45 dead letters of three tasks; filtered to one task (11 rows), "Discard all" discards
    those 11 and no other; filtered to a task in one queue (8 rows), "Requeue all" requeues 8."""
    made: dict[str, list[str]] = {}
    for n, (name, queue) in enumerate(
        [("proj.add", "celery")] * 11
        + [("proj.mul", "celery")] * 18
        + [("proj.mul", "io")] * 8
        + [("proj.sub", "io")] * 8
    ):
        task_id = insert(db, "DEAD", name=name, queue=queue, error="boom", updated_at=ago(600 + n))
        made.setdefault(name + "@" + queue, []).append(task_id)

    with serve(app, token=TOKEN) as base:
        log_in(page, base)
        page.goto(base + "/dead-letters")
        page.fill('form.filters input[name="task"]', "proj.add")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/dead-letters?task=proj.add*")
        rows = page.locator("#dead-letters tr[data-id]")
        assert rows.count() == 11
        shown = {rows.nth(i).get_attribute("data-id") for i in range(11)}
        assert shown == set(made["proj.add@celery"])
        assert "of task proj.add" in page.locator("#scope").inner_text()
        shoot(page, "dead-letters-filtered")

        page.get_by_role("button", name="Discard all").click()
        question = page.locator("#question")
        assert question.inner_text() == (
            "Discard 11 dead letters of task proj.add? This cannot be undone."
        )
        assert page.locator("#confirm-rows tr").count() == 11
        assert dead_counts(db)[("proj.add", "celery", "DEAD")] == 11  # not before confirming
        shoot(page, "dead-letters-confirm-discard")
        page.locator("#confirm").click()
        page.locator(".flash", has_text="Discarded 11 dead letters of task proj.add.").wait_for()
        assert page.locator("#dead-letters tr.empty").count() == 1
        assert dead_counts(db) == {
            ("proj.mul", "celery", "DEAD"): 18,
            ("proj.mul", "io", "DEAD"): 8,
            ("proj.sub", "io", "DEAD"): 8,
        }

        page.goto(base + "/dead-letters?task=proj.mul&queue=io")
        assert page.locator("#dead-letters tr[data-id]").count() == 8
        page.get_by_role("button", name="Requeue all").click()
        assert (
            page.locator("#question")
            .inner_text()
            .startswith("Requeue 8 dead letters of task proj.mul in queue io?")
        )
        page.locator("#confirm").click()
        page.locator(
            ".flash", has_text="Requeued 8 dead letters of task proj.mul in queue io."
        ).wait_for()
        shoot(page, "dead-letters-requeued-filtered")
    counts = dead_counts(db)
    assert counts[("proj.mul", "io", "PENDING")] == 8
    assert counts[("proj.mul", "celery", "DEAD")] == 18 and counts[("proj.sub", "io", "DEAD")] == 8
    assert {
        db.execute("SELECT status FROM tasks WHERE id = %s", (i,)).fetchone()[0]  # type: ignore[index]
        for i in made["proj.mul@io"]
    } == {"PENDING"}


def test_without_a_token_no_button_can_change_anything(
    app: Celery, db: psycopg.Connection[Any], page: Page
) -> None:
    dead = insert(db, "DEAD", name="proj.add", error="boom")
    with serve(app) as base:
        page.goto(base + "/dead-letters")
        assert "read-only" in page.locator("header .mode").inner_text()
        assert "start it with a token" in page.locator(".flash.readonly").inner_text().lower()
        page.locator("#live", has_text="live ·").wait_for()  # the rows were drawn again
        for name in ("Requeue selected", "Discard selected", "Requeue all", "Discard all"):
            assert page.get_by_role("button", name=name).is_disabled(), name
        row = page.locator(f'#dead-letters tr[data-id="{dead}"]')
        assert row.get_by_role("button", name="Requeue").is_disabled()
        assert row.get_by_role("button", name="Discard").is_disabled()
        shoot(page, "dead-letters-read-only")
    assert status_of(db, dead) == "DEAD"
