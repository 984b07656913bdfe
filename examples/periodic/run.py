"""Start a worker with ``-B`` (it runs the tasks and schedules the periodic ones), wait until the
heartbeat entry has run a few times, print what ran, and stop the worker:

python -m examples.periodic.run

The database is PGTASKS_DATABASE_URL, else an embedded PostgreSQL. Every enqueued tick is a row
of ``schedule_ticks`` (entry, tick time, task id): that is what lets any number of workers run
``-B`` at once, each tick being enqueued by exactly one of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from examples.periodic.tasks import app
from pgtasks.migrate import migrate
from pgtasks.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[2]
HEARTBEATS = 3
TIMEOUT = 60.0


def ticks(conn: psycopg.Connection[tuple[str, datetime, str]]) -> list[tuple[str, datetime, str]]:
    query = sql.SQL("SELECT name, tick_at, task_id FROM {}.schedule_ticks ORDER BY tick_at, name")
    return conn.execute(query.format(sql.Identifier(app.settings.schema_name))).fetchall()


def main() -> int:
    url = app.database_url  # starts the embedded server when no database is configured
    schema = app.settings.schema_name
    migrate(url, schema)
    env = {**os.environ, "PGTASKS_DATABASE_URL": url, "PGTASKS_SCHEMA_NAME": schema}
    command = [sys.executable, "-m", "pgtasks", "-A", "examples.periodic.tasks", "worker", "-B"]
    command += ["-P", "threads", "-c", "2", "-l", "WARNING"]
    worker = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + TIMEOUT
            while True:
                done = [
                    t for t in ticks(conn) if t[0] == "heartbeat" and app.AsyncResult(t[2]).ready()
                ]
                if len(done) >= HEARTBEATS:
                    break
                if worker.poll() is not None:
                    print(f"the worker exited early with code {worker.returncode}")
                    return 1
                if time.monotonic() > deadline:
                    print(f"timed out after {TIMEOUT:.0f}s waiting for {HEARTBEATS} heartbeats")
                    return 1
                time.sleep(0.2)
            ran = ticks(conn)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    print("ran:")
    for name, tick_at, task_id in ran:
        result = app.AsyncResult(task_id)
        outcome = result.result if result.ready() else result.state.lower()
        print(f"  {tick_at:%H:%M:%S}  {name:<20} {outcome}")
    print("next:")
    for entry in Scheduler(app).listing():
        print(f"  {entry['next_tick']:%Y-%m-%d %H:%M:%S}  {entry['name']:<20} {entry['schedule']}")
    app.close()
    print(f"worker stopped (exit code {worker.returncode})")
    return 0 if worker.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
