"""``pgtasks bench`` is an entry point beside the library: importing it does no work, its
workers find its app by ``-A``, and its own queries read as the library's do."""

from __future__ import annotations

import re
import subprocess
import sys

from pgtasks.cli.bench.store import PACKAGE
from pgtasks.cli.main import find_app
from pgtasks.sql import queries, raw_queries

#: Run in a fresh interpreter: every module of the bench imported, then what exists.
IMPORT_ALL = """
import gc, pkgutil, importlib
import pgtasks.cli.bench as bench
for info in pkgutil.iter_modules(bench.__path__):
    importlib.import_module(f"pgtasks.cli.bench.{info.name}")
from pgtasks.app import Celery
from pgtasks.broker import Broker
tasks = importlib.import_module("pgtasks.cli.bench.tasks")
made = [type(o).__name__ for o in gc.get_objects() if isinstance(o, (Celery, Broker))]
print("app" in vars(tasks), made)
"""


def test_importing_the_bench_makes_no_app_and_no_broker() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False []", done.stderr


def test_the_workers_find_the_bench_app_and_its_tasks_by_its_module() -> None:
    app = find_app("pgtasks.cli.bench.tasks")
    assert app.main == "pgtasks.bench"
    assert sorted(app.tasks) == [
        "pgtasks.bench.anoop",
        "pgtasks.bench.astamp",
        "pgtasks.bench.noop",
        "pgtasks.bench.stamp",
    ]


def test_the_bench_queries_are_its_own_and_keep_no_comment() -> None:
    own = raw_queries(PACKAGE)
    assert {"schema_state", "cost_sample", "maintenance", "steady_window"} <= set(own)
    assert not set(own) & set(raw_queries())
    for name, text in own.items():
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)
        assert "--" not in unquoted, name
    assert queries("pgtasks_bench", PACKAGE)["take_xid"] == b"SELECT txid_current()"
