"""What coordination tests share: bounded waits on database conditions, worker subprocesses that
are always killed, a transition audit on the task table, and moving due times through SQL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgtasks import Celery, Task

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
#: Warnings about the server rather than the run (see WorkerProcess.problems).
QUIET = frozenset({"worker.autovacuum_off"})

Row = dict[str, Any]


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float = 20.0,
    interval: float = 0.02,
    what: str = "the condition",
    details: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy (and return it); fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
        time.sleep(interval)


class RecordedWaits:
    """A listening connection whose waits are recorded in ``events``: each ``notifies()`` call
    as ("wait", its timeout), then "notify" for each notification it gives, or "timeout" when
    none came. ``longest_wait`` is set once a wait of ``longest`` seconds or more begins."""

    def __init__(self, conn: psycopg.Connection[Any], longest: float = float("inf")) -> None:
        self._conn = conn
        self._longest = longest
        self.events: list[Any] = []
        self.longest_wait = threading.Event()

    def notifies(self, *, timeout: float | None = None, stop_after: int | None = None) -> Any:
        self.events.append(("wait", timeout))
        if timeout is not None and timeout >= self._longest:
            self.longest_wait.set()
        woken = False
        for note in self._conn.notifies(timeout=timeout, stop_after=stop_after):
            woken = True
            self.events.append("notify")
            yield note
        if not woken:
            self.events.append("timeout")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def rows(db: psycopg.Connection[Any], query: str, params: Sequence[Any] = ()) -> list[Row]:
    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def one(db: psycopg.Connection[Any], query: str, params: Sequence[Any] = ()) -> Row:
    found = rows(db, query, params)
    assert len(found) == 1, f"expected one row, got {found!r}"
    return found[0]


def task_row(db: psycopg.Connection[Any], task_id: str) -> Row:
    """The task row, every column."""
    return one(db, "SELECT * FROM tasks WHERE id = %s", (task_id,))


def status(db: psycopg.Connection[Any], task_id: str) -> str:
    return str(task_row(db, task_id)["status"])


def attempts(db: psycopg.Connection[Any], task_id: str) -> list[tuple[int, str, str]]:
    """The attempt history of a task as (attempt, worker, outcome)."""
    query = "SELECT * FROM attempts WHERE task_id = %s ORDER BY attempt, finished_at"
    return [(r["attempt"], r["worker"], r["outcome"]) for r in rows(db, query, (task_id,))]


def executions(db: psycopg.Connection[Any], task_id: str) -> list[Row]:
    return rows(db, "SELECT * FROM executions WHERE task_id = %s ORDER BY attempt", (task_id,))


def db_clock_past(db: psycopg.Connection[Any], instant: Any, margin: float = 0.0) -> bool:
    """Whether the database's now() is more than ``margin`` seconds past ``instant``."""
    found = db.execute(
        "SELECT now() > %s + make_interval(secs => %s)", (instant, margin)
    ).fetchone()
    return bool(found and found[0])


def advance_due(db: psycopg.Connection[Any]) -> int:
    """Make every waiting row due now, as if the database clock had reached its run_at."""
    return db.execute(
        "UPDATE tasks SET run_at = now() WHERE status = 'PENDING' AND run_at > now()"
    ).rowcount


def expire_lease(db: psycopg.Connection[Any], task_id: str) -> None:
    """End a running row's lease, as if its owner had stopped renewing a while ago."""
    changed = db.execute(
        "UPDATE tasks SET lease_until = now() - interval '1 second'"
        " WHERE id = %s AND status = 'RUNNING'",
        (task_id,),
    ).rowcount
    assert changed == 1, f"task {task_id} is not running"


def install_audit(db: psycopg.Connection[Any], schema: str) -> None:
    """Log every status change of a task row, with the delay the same statement wrote
    (``run_at - updated_at``: both use that statement's ``now()``)."""
    ddl = sql.SQL(
        """
        CREATE TABLE {s}.audit (
            seq         bigserial PRIMARY KEY,
            task_id     text NOT NULL,
            old_status  text NOT NULL,
            new_status  text NOT NULL,
            attempt     integer NOT NULL,
            old_retries integer NOT NULL,
            new_retries integer NOT NULL,
            delay       float8 NOT NULL,
            claimed_by  text
        );
        CREATE FUNCTION {s}.audit_transition() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {s}.audit (task_id, old_status, new_status, attempt, old_retries,
                                   new_retries, delay, claimed_by)
            VALUES (NEW.id, OLD.status, NEW.status, NEW.attempt, OLD.retries, NEW.retries,
                    extract(epoch FROM NEW.run_at - NEW.updated_at), NEW.claimed_by);
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER audit_transition AFTER UPDATE ON {s}.tasks FOR EACH ROW
            WHEN (OLD.status IS DISTINCT FROM NEW.status)
            EXECUTE FUNCTION {s}.audit_transition();
        """
    ).format(s=sql.Identifier(schema))
    db.execute(ddl)


def note_inserts(
    db: psycopg.Connection[Any], schema: str, table: str, columns: dict[str, tuple[str, str]]
) -> Callable[[], list[Row]]:
    """From now on, for every row inserted into tasks, write a row to ``schema.table``: its
    ``task_id`` and each of ``columns`` (name: (SQL type, SQL expression evaluated in the
    inserting transaction)). Returns a reader of those rows in insert order."""
    names = [sql.Identifier(name) for name in columns]
    parts = {
        "s": sql.Identifier(schema),
        "t": sql.Identifier(table),
        "f": sql.Identifier(f"note_{table}"),
        "defs": sql.SQL(", ").join(
            sql.SQL("{} {}").format(name, sql.SQL(kind))
            for name, (kind, _) in zip(names, columns.values(), strict=True)
        ),
        "names": sql.SQL(", ").join(names),
        "values": sql.SQL(", ").join(sql.SQL(value) for _, value in columns.values()),
    }
    db.execute(
        sql.SQL(
            """
            CREATE TABLE {s}.{t} (seq bigserial, task_id text, {defs});
            CREATE FUNCTION {s}.{f}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {s}.{t} (task_id, {names}) VALUES (NEW.id, {values});
                RETURN NULL;
            END $$;
            CREATE TRIGGER {f} AFTER INSERT ON {s}.tasks
                FOR EACH ROW EXECUTE FUNCTION {s}.{f}();
            """
        ).format(**parts)
    )
    query = sql.SQL("SELECT * FROM {s}.{t} ORDER BY seq").format(**parts).as_string(db)
    return lambda: rows(db, query)


def audit(db: psycopg.Connection[Any], task_id: str) -> list[Row]:
    return rows(db, "SELECT * FROM audit WHERE task_id = %s ORDER BY seq", (task_id,))


def _remote_only(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("this task runs in the worker processes only")


def remote(app: Celery, name: str) -> Task[Any, Any]:
    """A handle on a task that worker subprocesses run, to enqueue it from the test."""
    return app.task(name=name)(_remote_only)


class WorkerProcess:
    """One ``python -m pgtasks worker`` subprocess, leader of its own process group, logging
    JSON lines of ``loglevel`` and above (see ``events``)."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        name: str,
        *,
        app: str = "tests.apps.coord",
        pool: str = "threads",
        concurrency: int = 2,
        lease: float = 2.0,
        poll_interval: float = 0.05,
        loglevel: str = "WARNING",
    ) -> None:
        self.name = name
        fd, log = tempfile.mkstemp(prefix=f"pgtasks-{name}-", suffix=".log")
        self._log = Path(log)
        env = dict(os.environ)
        env.pop("PGTASKS_APP", None)
        env.update(
            PGTASKS_DATABASE_URL=dsn,
            PGTASKS_SCHEMA_NAME=schema,
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        )
        command = [
            sys.executable,
            "-m",
            "pgtasks",
            "-A",
            app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            name,
            "--lease",
            str(lease),
            "--poll-interval",
            str(poll_interval),
            "-l",
            loglevel,
            "--log-format",
            "json",
        ]
        try:
            self.proc = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(fd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self._log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(log removed)"

    def events(self) -> list[dict[str, Any]]:
        """The worker's log events (JSON lines; anything else is kept as a message)."""
        found = []
        for line in self.output().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"level": "unparsed", "event": line}
            found.append(event if isinstance(event, dict) else {"event": line})
        return found

    def problems(self) -> list[dict[str, Any]]:
        """Log events at warning level or above (none in an undisturbed run), but for the
        warning that autovacuum is off: some test servers turn it off, and it says nothing of
        the run."""
        return [
            e
            for e in self.events()
            if e.get("level") not in ("debug", "info") and e.get("event") not in QUIET
        ]

    def describe(self) -> str:
        state = "running" if self.alive() else f"exited {self.proc.returncode}"
        return f"--- worker {self.name} (pid {self.pid}, {state}) ---\n{self.output()[-4000:]}"

    def wait_ready(self, db: psycopg.Connection[Any], timeout: float = 30.0) -> None:
        """Wait until the worker has registered itself in the database."""

        def registered() -> bool:
            if not self.alive():
                raise AssertionError(f"worker exited during start-up\n{self.describe()}")
            found = db.execute("SELECT 1 FROM workers WHERE id = %s", (self.name,)).fetchone()
            return found is not None

        wait_until(registered, timeout=timeout, what=f"worker {self.name} to start")

    def kill(self) -> None:
        """``kill -9`` of the worker's main process only (its children, if any, are orphaned)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        """Kill the whole process group and reap the worker."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)
        self._log.unlink(missing_ok=True)


@contextlib.contextmanager
def worker_processes(
    dsn: str,
    schema: str,
    names: Sequence[str],
    *,
    ready: psycopg.Connection[Any] | None = None,
    **options: Any,
) -> Iterator[list[WorkerProcess]]:
    """Start one worker subprocess per name (waiting until each registered when ``ready`` is a
    connection), and kill all of them when the block ends, whatever happens in it."""
    started: list[WorkerProcess] = []
    try:
        for name in names:
            started.append(WorkerProcess(dsn, schema, name, **options))
        if ready is not None:
            for worker in started:
                worker.wait_ready(ready)
        yield started
    finally:
        for worker in started:
            worker.close()


def describe_all(workers: Sequence[WorkerProcess]) -> Callable[[], str]:
    """Worker logs for a failure message."""
    return lambda: "\n".join(w.describe() for w in workers)
