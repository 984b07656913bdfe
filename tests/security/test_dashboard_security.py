"""Attacks on the dashboard, each tried against a real app on real Postgres: weak tokens,
guessing the token, a session that outlives its logout, a cookie sent in clear behind a TLS
proxy, a token on the command line, changes without a token, cross-site and oversized
requests, values the database cannot take, error pages, redirects and spoofed messages."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.types import ASGIApp

from pgtasks import Celery
from pgtasks.dashboard import WeakToken, create_app
from pgtasks.dashboard.security import LoginLimiter, Sessions
from tests.acceptance.test_cli import REPO, cli_env
from tests.apps.harness import wait_until
from tests.integration.test_dashboard_api import BASE, csrf_of, from_client, status_of
from tests.integration.test_ops_queries import insert

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "dashboard-token-for-the-tests-0123"
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client(
    web: ASGIApp, host: str = "127.0.0.1", base_url: str = BASE, **kwargs: Any
) -> TestClient:
    return TestClient(from_client(web, host), base_url=base_url, **kwargs)


def logged_in(web: ASGIApp, host: str = "127.0.0.1") -> TestClient:
    browser = client(web, host)
    answer = browser.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return browser


def set_cookie(answer: Any) -> str:
    return str(answer.headers.get("set-cookie", ""))


# -- 1. weak tokens -----------------------------------------------------------------------------


def test_a_short_token_is_refused(app: Celery, pg_dsn: str, schema: str, tmp_path: Path) -> None:
    for weak in ("x", "s3cret", "fifteen-chars-x", "sixteen chars xx", "sixteen-chars-é!"):
        with pytest.raises(WeakToken) as refused:
            create_app(app, token=weak)
        assert MAKE_TOKEN in str(refused.value)
    create_app(app, token="sixteen-chars-xx")  # long enough

    env = cli_env(pg_dsn, schema)
    short = tmp_path / "token"
    short.write_text("x\n")
    short.chmod(0o600)
    for args, extra in (
        (["--token-file", str(short)], {}),
        ([], {"PGTASKS_DASHBOARD_TOKEN": "s3cret"}),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pgtasks", "dashboard", "--port", "0", *args],
            cwd=REPO,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, done.stderr
        assert "too short" in done.stderr and MAKE_TOKEN in done.stderr


# -- 2. guessing the token -----------------------------------------------------------------------


def test_wrong_tokens_are_rate_limited_per_client(app: Celery) -> None:
    clock = Clock()
    web = create_app(app, token=TOKEN, limiter=LoginLimiter(failures=5, window=60, clock=clock))
    guesser = client(web, "198.51.100.7")
    for n in range(5):
        wrong = guesser.post("/login", data={"token": f"guess-number-{n:04}-xxxx"})
        assert wrong.status_code == 401
    limited = guesser.post("/login", data={"token": "guess-number-0005-xxxx"})
    assert limited.status_code == 429
    wait = int(limited.headers["retry-after"])
    assert 1 <= wait <= 60
    assert f"try again in {wait} s" in limited.text
    # The right token is refused too while the client waits: the answer tells nothing.
    right = guesser.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert right.status_code == 429
    bearer = guesser.get("/api/queues", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429 and bearer.headers["retry-after"]
    # Another address is not held up, and its success does not free the guesser.
    assert logged_in(web, "198.51.100.8").get("/queues").status_code == 200
    assert guesser.post("/login", data={"token": TOKEN}).status_code == 429

    # Forwarded headers from a client that is no proxy do not make it someone else.
    spoofer = client(web, "198.51.100.9")
    for n in range(6):
        answer = spoofer.get(
            "/api/queues",
            headers={
                "Authorization": "Bearer wrong-token-xxxxxxxx",
                "X-Forwarded-For": f"10.9.9.{n}",
            },
        )
    assert answer.status_code == 429

    clock.now += 61
    assert guesser.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303


def test_failures_from_one_ipv6_network_count_together(app: Celery) -> None:
    web = create_app(app, token=TOKEN)
    for n in range(5):
        answer = client(web, f"2001:db8:1:2::{n + 1:x}").post("/login", data={"token": "nope"})
        assert answer.status_code == 401
    assert client(web, "2001:db8:1:2::99").post("/login", data={"token": TOKEN}).status_code == 429
    assert client(web, "2001:db8:1:3::1").post("/login", data={"token": "nope"}).status_code == 401


# -- 3. sessions ----------------------------------------------------------------------------------


def test_a_cookie_captured_before_logout_is_refused_after_it(app: Celery) -> None:
    web = create_app(app, token=TOKEN)
    browser = client(web)
    first = browser.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    captured = browser.cookies.get("pgtasks_dashboard")
    assert captured and TOKEN not in set_cookie(first)
    again = client(web).post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert re.search(r"pgtasks_dashboard=([^;]+)", set_cookie(again))[1] != captured  # type: ignore[index]

    page = browser.get("/queues")
    assert page.status_code == 200
    out = browser.post("/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"

    thief = client(web)
    thief.cookies.set("pgtasks_dashboard", captured)
    shown = thief.get("/queues", follow_redirects=False)
    assert shown.status_code == 303 and shown.headers["location"].startswith("/login")
    assert thief.get("/api/queues").status_code == 401


def test_a_session_expires(app: Celery) -> None:
    clock = Clock()
    web = create_app(app, token=TOKEN, sessions=Sessions(lifetime=3600, clock=clock))
    browser = logged_in(web)
    assert browser.get("/api/queues").status_code == 200
    clock.now += 3599
    assert browser.get("/api/queues").status_code == 200
    clock.now += 2
    assert browser.get("/api/queues").status_code == 401


# -- 4. the cookie's flags behind a TLS proxy ------------------------------------------------------


def login_cookie(web: ASGIApp, host: str, headers: dict[str, str] | None = None, **kw: Any) -> str:
    answer = client(web, host, **kw).post(
        "/login", data={"token": TOKEN}, headers=headers or {}, follow_redirects=False
    )
    assert answer.status_code == 303
    cookie = set_cookie(answer)
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    return cookie


def test_the_cookie_is_secure_behind_a_tls_proxy_it_trusts(app: Celery) -> None:
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.44"}
    default = create_app(app, token=TOKEN)
    assert "Secure" in login_cookie(default, "127.0.0.1", https)  # a proxy on this machine
    assert "Secure" not in login_cookie(default, "127.0.0.1")
    assert "Secure" not in login_cookie(default, "203.0.113.9", https)  # no proxy of ours
    assert "Secure" in login_cookie(default, "203.0.113.9", base_url="https://dash.example")

    behind = create_app(app, token=TOKEN, forwarded_allow_ips="10.0.0.0/8")
    assert "Secure" in login_cookie(behind, "10.1.2.3", https)
    assert "Secure" in login_cookie(behind, "::ffff:10.1.2.3", https)
    assert "Secure" not in login_cookie(behind, "127.0.0.1", https)
    assert "Secure" in login_cookie(behind, "10.1.2.3", {"X-Forwarded-Proto": "http, https"})

    with pytest.raises(ValueError, match="not an IP address or network"):
        create_app(app, token=TOKEN, forwarded_allow_ips="proxy.example")


def test_the_proxy_names_the_client_whose_guesses_count(app: Celery) -> None:
    web = create_app(app, token=TOKEN, forwarded_allow_ips="10.0.0.2")
    proxy = client(web, "10.0.0.2")
    for _ in range(5):
        proxy.post("/login", data={"token": "nope"}, headers={"X-Forwarded-For": "192.0.2.1"})
    limited = proxy.post("/login", data={"token": TOKEN}, headers={"X-Forwarded-For": "192.0.2.1"})
    assert limited.status_code == 429
    other = proxy.post(
        "/login",
        data={"token": TOKEN},
        headers={"X-Forwarded-For": "192.0.2.1, 192.0.2.2"},  # the last hop is the client
        follow_redirects=False,
    )
    assert other.status_code == 303


# -- 5. the token on the command line ------------------------------------------------------------


@contextmanager
def dashboard_process(
    env: dict[str, str], *args: str
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``pgtasks dashboard --port 0 ARGS`` until the block ends; its stderr lines so far."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgtasks",
            "-A",
            "tests.acceptance.cliapp",
            "dashboard",
            "--port",
            "0",
            *args,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        yield proc, lines
    finally:
        proc.kill()
        proc.wait(10)
        reader.join(10)
        proc.stderr.close()


def started(proc: subprocess.Popen[str], lines: list[str]) -> str:
    wait_until(
        lambda: proc.poll() is not None or any("Uvicorn running" in line for line in lines),
        what="the dashboard to start",
    )
    assert proc.poll() is None, "".join(lines)
    return "".join(lines)


def test_the_token_is_read_from_a_file_or_the_environment(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = cli_env(pg_dsn, schema)
    helped = subprocess.run(
        [sys.executable, "-m", "pgtasks", "dashboard", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "--token-file PATH" in helped.stdout
    assert "PGTASKS_DASHBOARD_TOKEN" in helped.stdout
    assert "visible to every user" in helped.stdout
    assert MAKE_TOKEN in helped.stdout

    secret = tmp_path / "dashboard-token"
    secret.write_text(TOKEN + "\n")
    secret.chmod(0o600)
    with dashboard_process(env, "--token-file", str(secret)) as (proc, lines):
        said = started(proc, lines)
        assert "token" in said and "warning" not in said
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert TOKEN.encode() not in argv
    with dashboard_process({**env, "PGTASKS_DASHBOARD_TOKEN": TOKEN}) as (proc, lines):
        said = started(proc, lines)
        assert "warning" not in said and "READ-ONLY" not in said
    with dashboard_process(env, "--token", TOKEN) as (proc, lines):
        said = started(proc, lines)
        assert "warning: --token is visible to every user of this machine" in said

    secret.chmod(0o644)
    with dashboard_process(env, "--token-file", str(secret)) as (proc, lines):
        assert "can be read by other users" in started(proc, lines)

    both = subprocess.run(
        [sys.executable, "-m", "pgtasks", "dashboard", "--token-file", str(secret)],
        cwd=REPO,
        env={**env, "PGTASKS_DASHBOARD_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert both.returncode == 2 and "give the token once" in both.stderr


# -- 6. no token, no changes ----------------------------------------------------------------------


def test_without_a_token_the_dashboard_is_read_only(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    dead = insert(db, "DEAD", name="proj.add", error="boom")
    web = client(create_app(app))  # a process on this very machine
    page = web.get("/dead-letters")
    assert page.status_code == 200
    assert "This dashboard is read-only: it was started without a token." in page.text
    assert 'data-readonly="' in page.text
    for name in ("requeue_all", "discard_all", "requeue_selected", "discard_selected"):
        assert re.search(rf'value="{name}"[^>]* disabled>', page.text), name

    writes = [
        web.post("/api/tasks", json={"task": "proj.add", "args": [1, 2]}),
        web.post("/api/dead-letters/requeue", json={"ids": [dead]}),
        web.post("/api/dead-letters/discard", json={"all": True}),
        web.post("/dead-letters", data={"csrf": "", "requeue_one": dead}),
        web.post("/dead-letters", data={"csrf": "", "action": "discard_all", "confirmed": "yes"}),
    ]
    for answer in writes:
        assert answer.status_code == 403
        assert "read-only" in answer.text and "token" in answer.text
    assert status_of(db, dead) == "DEAD"
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (1,)

    env = cli_env(pg_dsn, schema)
    with dashboard_process(env) as (proc, lines):
        said = started(proc, lines)
        assert "READ-ONLY: this dashboard is read-only" in said
        assert MAKE_TOKEN in said


# -- more of the same kind ------------------------------------------------------------------------


def test_a_logged_in_page_changes_through_the_api_only_with_its_csrf_token(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    dead = insert(db, "DEAD", name="proj.add")
    browser = logged_in(create_app(app, token=TOKEN))
    refused = browser.post("/api/dead-letters/requeue", json={"ids": [dead]})
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"]
    forged = browser.post(
        "/api/dead-letters/requeue", json={"ids": [dead]}, headers={"X-CSRF-Token": "0" * 64}
    )
    assert forged.status_code == 403
    assert status_of(db, dead) == "DEAD"
    csrf = csrf_of(browser.get("/dead-letters").text)
    done = browser.post(
        "/api/dead-letters/requeue", json={"ids": [dead]}, headers={"X-CSRF-Token": csrf}
    )
    assert done.json() == {"requeued": 1}
    # A form without the session's CSRF token changes nothing either.
    db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (dead,))
    assert browser.post("/dead-letters", data={"requeue_one": dead}).status_code == 403
    other = logged_in(create_app(app, token=TOKEN))
    stale = other.post("/dead-letters", data={"csrf": csrf, "requeue_one": dead})
    assert stale.status_code == 403  # another session's token
    assert status_of(db, dead) == "DEAD"


def test_request_bodies_are_bounded(app: Celery, db: psycopg.Connection[Any]) -> None:
    api = client(create_app(app, token=TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    huge = b'{"task": "proj.add", "args": [' + b"1," * 600_000 + b"1]}"
    said = api.post("/api/tasks", content=huge, headers={"Content-Type": "application/json"})
    assert said.status_code == 413 and "larger than" in said.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: read until the bound, then stop
        yield b'{"task": "proj.add", "args": ['
        for _ in range(2_000):
            yield b"1," * 1000
        yield b"1]}"

    streamed = api.post(
        "/api/tasks", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    form = api.post("/dead-letters", data={"csrf": "x" * (1 << 21)})
    assert form.status_code == 413
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)


def test_values_the_database_cannot_take_are_bad_requests(app: Celery) -> None:
    api = client(create_app(app, token=TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    for path in ("/api/tasks/%00", "/api/tasks?name=a%00b", "/api/dead-letters?task=%00"):
        answer = api.get(path)
        assert answer.status_code == 400, path
        assert "NUL" in answer.json()["error"]
    assert api.get("/tasks/%00").status_code == 400
    sent = api.post("/api/tasks", json={"task": "a\u0000b"})
    assert sent.status_code == 400


def test_an_unexpected_error_shows_no_traceback(app: Celery, db: psycopg.Connection[Any]) -> None:
    db.execute("ALTER TABLE tasks RENAME COLUMN error TO error_renamed")
    web = create_app(app, token=TOKEN)
    api = client(web, raise_server_exceptions=False)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    answer = api.get("/api/dead-letters", headers=bearer)
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal error: the dashboard's log has the details"}
    page = logged_in(web)
    page = client(web, raise_server_exceptions=False, cookies=dict(page.cookies))
    shown = page.get("/dead-letters")
    assert shown.status_code == 500
    for leak in ("Traceback", "error_renamed", "psycopg", "SELECT", "File "):
        assert leak not in shown.text and leak not in answer.text


def test_login_redirects_only_to_this_site(app: Celery) -> None:
    web = create_app(app, token=TOKEN)
    for target in (
        "//evil.example/",
        "/\\evil.example/",
        "/\t/evil.example/",
        "/\n/evil.example/",
        "/\r\n/evil.example",
        "https://evil.example/",
        "javascript:alert(1)",
        " /x",
        "/%0d%0aSet-Cookie:x=1",
    ):
        answer = client(web).post(
            "/login", data={"token": TOKEN, "next": target}, follow_redirects=False
        )
        location = answer.headers["location"]
        # What a browser does to a Location before it follows it.
        followed = re.sub(r"[\t\n\r]", "", location).replace("\\", "/")
        assert followed.startswith("/") and not followed.startswith("//"), (target, location)
        assert "\n" not in location and "\r" not in location
    kept = client(web).post(
        "/login", data={"token": TOKEN, "next": "/tasks?state=FAILED"}, follow_redirects=False
    )
    assert kept.headers["location"] == "/tasks?state=FAILED"
    page = client(web).get("/login", params={"next": "//evil.example"})
    assert 'name="next" value="/"' in page.text


def test_a_link_cannot_make_the_dashboard_say_it_changed_something(app: Celery) -> None:
    browser = logged_in(create_app(app, token=TOKEN))
    spoofed = browser.get("/dead-letters", params={"done": "Requeued 5000 dead letters."})
    assert "Requeued 5000" not in spoofed.text
    forged = browser.get("/dead-letters", params={"done": "Requeued 5000.", "sig": "0" * 32})
    assert "Requeued 5000" not in forged.text
