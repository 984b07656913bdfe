"""Database roles for the three kinds of client: producers, workers and administrators.

``pgtasks grants`` gives existing roles what each kind needs, and nothing more:

* a **producer** enqueues (``delay``, ``apply_async``, groups, chords) and reads states and
  results; optionally only to some queues and only some task names. It cannot claim, finish,
  revoke, purge, requeue or delete anything.
* a **worker** claims, renews, finishes, retries and reclaims tasks, enqueues follow-ups, runs
  the scheduler, and prunes finished rows. It cannot purge waiting tasks, touch dead-lettered
  ones (requeue or discard) or change the schema.
* an **administrator** owns the schema: migrations, purge, requeue, discard, everything.

Table privileges say which statements a role may run; row-level security on ``tasks`` says
which rows: a producer may insert only into its queues and task names, a worker may update
only rows that are not dead-lettered and delete only finished ones. Once row-level security is
on, a role given nothing here sees no task at all: give every client role through this module.
The roles themselves must exist (``CREATE ROLE ... LOGIN``); the statements run as the schema's
owner or a superuser. Every statement is built with :mod:`psycopg.sql`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

#: Every table of the schema (``migrations`` holds the applied versions).
TABLES = (
    "tasks",
    "results",
    "attempts",
    "workers",
    "chords",
    "group_results",
    "rate_limits",
    "schedule_entries",
    "schedule_ticks",
    "quotas",
    "unique_keys",
    "effects",
    "concurrency_limits",
    "parked_workers",
    "migrations",
)
#: Every function of the schema, with its argument types.
FUNCTIONS = (
    ("notify_due", ""),
    ("notify_result", ""),
    ("enforce_quotas", ""),
    ("concurrency_key", "jsonb"),
    (
        "hand_off",
        "text, text, text, integer, integer, text, text, text, bytea, jsonb, timestamptz,"
        " timestamptz",
    ),
    ("wake", "text"),
)
#: Tables a producer writes, and how.
PRODUCER_TABLES = {
    "tasks": ("SELECT", "INSERT"),
    "results": ("SELECT",),
    "workers": ("SELECT",),
    "chords": ("INSERT",),
    "group_results": ("SELECT", "INSERT", "UPDATE"),
    "quotas": ("SELECT",),
    # A unique task's key held for a window is taken (or found held) by an upsert.
    "unique_keys": ("SELECT", "INSERT", "UPDATE"),
    # A single enqueue takes a parked worker's row (locked first, hence UPDATE of a column).
    "parked_workers": ("SELECT", "DELETE", "UPDATE (until)"),
    "migrations": ("SELECT",),
}
WORKER_RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: Statuses whose rows a worker may delete (the pruner's; never waiting or dead-lettered ones).
FINISHED = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Roles:
    producers: Sequence[str] = ()
    workers: Sequence[str] = ()
    admins: Sequence[str] = ()
    #: Producers may enqueue only to these queues (None: any queue).
    queues: Sequence[str] | None = None
    #: Producers may enqueue only these task names; ``prefix.*`` allows a whole prefix
    #: (None: any name).
    task_names: Sequence[str] | None = None


def _rights(names: Sequence[str]) -> sql.Composed:
    """Privilege keywords (from the constants above) as SQL."""
    return sql.SQL(", ").join(sql.SQL(name) for name in names)


def _policy(kind: str, role: str) -> sql.Identifier:
    return sql.Identifier(f"pgtasks_{kind}_{role}"[:63])


def _names_check(patterns: Sequence[str]) -> sql.Composable:
    """``name`` matches one of ``patterns`` (exact names, or ``prefix.*``)."""
    exact = [p for p in patterns if not p.endswith("*")]
    prefixes = [p[:-1] for p in patterns if p.endswith("*")]
    parts: list[sql.Composable] = []
    if exact:
        parts.append(sql.SQL("name = ANY({})").format(sql.Literal(exact)))
    for prefix in prefixes:
        parts.append(sql.SQL("starts_with(name, {})").format(sql.Literal(prefix)))
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts)) if parts else sql.SQL("false")


def _producer_check(roles: Roles) -> sql.Composable:
    checks: list[sql.Composable] = []
    if roles.queues is not None:
        checks.append(sql.SQL("queue = ANY({})").format(sql.Literal(list(roles.queues))))
    if roles.task_names is not None:
        checks.append(_names_check(roles.task_names))
    return sql.SQL(" AND ").join(checks) if checks else sql.SQL("true")


def statements(schema: str, roles: Roles) -> list[sql.Composed]:
    """The statements giving ``roles`` their rights in ``schema`` (idempotent: run again with
    other queues or names, a role's policies are replaced)."""
    s = sql.Identifier(schema)

    def table(name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(s, sql.Identifier(name))

    tasks = table("tasks")
    out: list[sql.Composed] = []
    for admin in roles.admins:
        role = sql.Identifier(admin)
        out.append(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(s, role))
        for name in TABLES:
            out.append(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table(name), role))
        for function, args in FUNCTIONS:
            out.append(
                sql.SQL("ALTER FUNCTION {}.{}({}) OWNER TO {}").format(
                    s, sql.Identifier(function), sql.SQL(args), role
                )
            )
    clients = [*roles.producers, *roles.workers]
    for client in clients:
        out.append(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, sql.Identifier(client)))
    for producer in roles.producers:
        role = sql.Identifier(producer)
        for name in TABLES:
            out.append(sql.SQL("REVOKE ALL ON {} FROM {}").format(table(name), role))
        for name, rights in PRODUCER_TABLES.items():
            out.append(sql.SQL("GRANT {} ON {} TO {}").format(_rights(rights), table(name), role))
    for worker in roles.workers:
        role = sql.Identifier(worker)
        for name in TABLES:
            # Quotas and the schema version are the admin's to change.
            rights = ("SELECT",) if name in ("migrations", "quotas") else WORKER_RIGHTS
            out.append(sql.SQL("GRANT {} ON {} TO {}").format(_rights(rights), table(name), role))
    if clients:
        out.append(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(tasks))
    for client in clients:
        role = sql.Identifier(client)
        out += _replace_policy(
            tasks, _policy("read", client), sql.SQL("SELECT"), role, using=sql.SQL("true")
        )
    for producer in roles.producers:
        role = sql.Identifier(producer)
        out += _replace_policy(
            tasks,
            _policy("enqueue", producer),
            sql.SQL("INSERT"),
            role,
            check=_producer_check(roles),
        )
    for worker in roles.workers:
        role = sql.Identifier(worker)
        out += _replace_policy(
            tasks, _policy("enqueue", worker), sql.SQL("INSERT"), role, check=sql.SQL("true")
        )
        # Claims, renewals, outcomes, retries and reclaims: never a dead-lettered row.
        out += _replace_policy(
            tasks,
            _policy("update", worker),
            sql.SQL("UPDATE"),
            role,
            using=sql.SQL("status <> 'DEAD'"),
            check=sql.SQL("true"),
        )
        # Pruning: finished rows only, never waiting ones (a purge) or dead-lettered ones.
        out += _replace_policy(
            tasks,
            _policy("prune", worker),
            sql.SQL("DELETE"),
            role,
            using=sql.SQL("status = ANY({})").format(sql.Literal(list(FINISHED))),
        )
    return out


def _replace_policy(
    table: sql.Composable,
    name: sql.Identifier,
    command: sql.SQL,
    role: sql.Identifier,
    using: sql.Composable | None = None,
    check: sql.Composable | None = None,
) -> list[sql.Composed]:
    create = sql.SQL("CREATE POLICY {} ON {} FOR {} TO {}").format(name, table, command, role)
    if using is not None:
        create = sql.SQL("{} USING ({})").format(create, using)
    if check is not None:
        create = sql.SQL("{} WITH CHECK ({})").format(create, check)
    return [sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(name, table), create]


def missing_roles(conn: psycopg.Connection[Any], names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are not roles of the server."""
    wanted = sorted(set(names))
    found = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (wanted,))
    present = {row[0] for row in found.fetchall()}
    return [name for name in wanted if name not in present]


def apply(dsn: str, schema: str, roles: Roles) -> list[str]:
    """Run the statements in one transaction; returns them as text."""
    with psycopg.connect(dsn) as conn:
        missing = missing_roles(conn, [*roles.producers, *roles.workers, *roles.admins])
        if missing:
            raise ValueError(
                f"no such role: {', '.join(missing)}; create it first "
                "(CREATE ROLE name LOGIN PASSWORD '...')"
            )
        done = []
        with conn.transaction():
            for statement in statements(schema, roles):
                conn.execute(statement)
                done.append(statement.as_string(conn))
        return done
