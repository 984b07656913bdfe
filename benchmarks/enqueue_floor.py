"""How close one-by-one enqueueing comes to what the disk allows, round by round.

Each round, on the shared harness's services (``./services.sh start`` in the harness first):

1. the harness's enqueue phase for pgtasks and Celery (``driver.py --skip process,ceiling``);
2. a Python loop that does nothing but libpq's ``PQexecPrepared`` of pgtasks' plain enqueue
   statement (the ``INSERT`` of ``insert_task``) with the row a ``delay()`` writes, a new id each
   call, and the same loop with the hand-off statement a ``delay()`` sends;
3. ``pgbench -M prepared``, one client, with that ``INSERT`` and with the hand-off statement a
   ``delay()`` sends, every commit waiting for the disk as the server is set.

The three measure, side by side in the same minutes, the Python-bound enqueue of a broker that
keeps nothing on disk, pgtasks' ``delay()``, and the least a client can spend on a durable row.
The last column is the time of the hand-off loop's call that is not the caller's CPU (the
network, the server's work and the commit's wait for the disk) against the time a call may take
for 1.2 times Celery's rate: where the first is the larger, no producer that sends that statement
and waits for its commit can reach that rate, however little CPU it spends::

    cd ../shared/bench && ./services.sh start
    PGTASKS_BENCH_SRC=/path/to/pgtasks-snapshot \\
      python /path/to/pgtasks/benchmarks/enqueue_floor.py --harness . --rounds 3

Run it with the ``python`` that runs the harness's ``driver.py`` (it needs pgtasks, Celery and
psycopg). Tables it writes rows into are emptied after each round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import psycopg
from psycopg import pq, sql

from pgtasks.broker import _text_param
from pgtasks.sql import native, queries, raw_queries

HERE = os.path.dirname(os.path.abspath(__file__))
DB = "bench_pgtasks"
SCHEMA = "pgtasks"
#: The row of a ``delay("r", ts)`` of the harness's task, by the statements' parameter names.
ROW: dict[str, Any] = {
    "name": "bench.task",
    "queue": "celery",
    "priority": 0,
    "eta": None,
    "countdown": None,
    "expires_at": None,
    "expires_in": None,
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "payload": '[["r", 1796614000.123456], {}]',
    "payload_raw": None,
    "headers": '{"argsrepr": "(\'r\', 1796614000.123456)", "kwargsrepr": "{}", '
    '"ignore_result": true}',
    "max_retries": 3,
    "early": False,
}


def pgbench_script(name: str) -> str:
    """pgtasks' statement ``name`` as a pgbench script: the values of ``ROW`` written in, the
    id drawn at random (a parameter under ``-M prepared``)."""
    text = raw_queries()[name].replace("{schema}", SCHEMA)
    values = {n: sql.Literal(v).as_string(None) for n, v in ROW.items()}
    values["id"] = "(:r)::text"
    text = re.sub(r"%\((\w+)\)s", lambda m: values[m.group(1)], text)
    return "\\set r random(1, 1000000000000)\n" + " ".join(text.split()) + ";\n"


def enqueue_phase(harness: str, label: str, out: str) -> dict[str, float]:
    """The harness's one-by-one enqueue rates for pgtasks and Celery, in one driver run."""
    env = dict(os.environ)
    env["BENCH_EXTRA_ADAPTERS"] = "pgtasks=" + os.path.join(HERE, "pgtasks_adapter.py")
    subprocess.run(
        [
            *(sys.executable, "driver.py", "--systems", "pgtasks,celery"),
            *("--configs", "pgtasks:2proc-c1-threads,celery:solo-x2", "--reps", "1"),
            *("--skip", "process,ceiling", "--label", label, "--out", out),
        ],
        cwd=harness,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    rates: dict[str, float] = {}
    with open(out, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("label") == label and row.get("metric") == "enqueue_single":
                rates[row["system"]] = float(row["rate"])
    return rates


def libpq_loop(dsn: str, name: str, calls: int) -> tuple[float, float]:
    """Calls a second and the caller's CPU (µs a call) of pgtasks' enqueue statement ``name``
    (``insert_task`` or ``insert_task_handoff``), prepared and sent with ``ROW`` as text, a
    new id each call."""
    query = queries(SCHEMA)[name]
    assert isinstance(query, bytes), "an ASCII schema's queries are bytes"
    text, names = native(query)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg = conn.pgconn
        row = dict(ROW, id="")
        params = [_text_param(row[n], conn.info.encoding) for n in names]
        at = names.index("id")
        result = pg.prepare(b"floor", text)
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise RuntimeError(result.get_error_message())
        ok = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            params[at] = str(uuid.uuid4()).encode()
            result = pg.exec_prepared(b"floor", params)
            if result.status not in ok:
                raise RuntimeError(result.get_error_message())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return calls / wall, cpu / calls * 1e6


def pgbench(pgbench_bin: str, dsn_parts: dict[str, str], script: str, seconds: int) -> float:
    """Statements a second of ``script`` from one pgbench client."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        env = dict(os.environ, PGOPTIONS="-c pgtasks.gated=on")
        done = subprocess.run(
            [
                *(pgbench_bin, "-h", dsn_parts["host"], "-p", dsn_parts["port"]),
                *("-U", dsn_parts["user"], "-n", "-M", "prepared", "-c", "1"),
                *("-T", str(seconds), "-f", f.name, DB),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(f.name)
    found = re.search(r"^tps = ([\d.]+)", done.stdout, re.MULTILINE)
    if not found:
        raise RuntimeError(f"no rate in pgbench's output:\n{done.stdout}\n{done.stderr}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--harness", default=".", help="the shared harness's folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=6000, help="of the libpq loop")
    parser.add_argument("--seconds", type=int, default=6, help="of each pgbench run")
    parser.add_argument("--out", default=None, help="the driver's JSONL (default: a temp file)")
    args = parser.parse_args()
    harness = os.path.abspath(args.harness)
    sys.path.insert(0, harness)
    import common  # the harness's module: its database addresses

    pgbench_bin = shutil.which("pgbench") or os.path.join(
        os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin"), "pgbench"
    )
    dsn = common.dsn(DB)
    parts = {"host": common.PG_HOST, "port": str(common.PG_PORT), "user": common.PG_USER}
    scripts = {
        "insert": pgbench_script("insert_task"),
        "handoff": pgbench_script("insert_task_handoff"),
    }
    out = args.out or tempfile.mkstemp(suffix=".jsonl")[1]
    print(
        "| round | Celery `delay()` | pgtasks `delay()` | Python, libpq only: the `INSERT` "
        "| the same, the hand-off statement | `pgbench`, the `INSERT` "
        "| `pgbench`, the hand-off statement | 1.2x Celery | hand-off call less its CPU "
        "/ a call at 1.2x Celery |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        rates = enqueue_phase(harness, f"floor-{int(time.time())}-{n}", out)
        bare, cpu = libpq_loop(dsn, "insert_task", args.calls)
        bare_h, cpu_h = libpq_loop(dsn, "insert_task_handoff", args.calls)
        insert = pgbench(pgbench_bin, parts, scripts["insert"], args.seconds)
        handoff = pgbench(pgbench_bin, parts, scripts["handoff"], args.seconds)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {SCHEMA}.tasks")
        celery, pgtasks = rates["celery"], rates["pgtasks"]
        waited = 1e6 / bare_h - cpu_h
        budget = 1e6 / (1.2 * celery)
        print(
            f"| {n} | {celery:,.0f}/s | {pgtasks:,.0f}/s ({pgtasks / celery:.2f}x) "
            f"| {bare:,.0f}/s ({cpu:.0f} µs of CPU a call) "
            f"| {bare_h:,.0f}/s ({cpu_h:.0f} µs of CPU) | {insert:,.0f}/s "
            f"| {handoff:,.0f}/s | {1.2 * celery:,.0f}/s | {waited:.0f} / {budget:.0f} µs |",
            flush=True,
        )


if __name__ == "__main__":
    main()
