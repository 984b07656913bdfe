"""Database roles for the three kinds of client: producers, workers and administrators.

``pgtasks grants`` gives existing roles what each kind needs, and nothing more:

* a **producer** enqueues (``delay``, ``apply_async``, groups, chords) and reads states and
  results; optionally only to some queues and only some task names. Its rows are waiting
  rows nobody has touched, of its own source (its role, which quotas count by), within a
  priority and payload bound. It reads the rows of the queues and task names it may enqueue,
  and their results while the rows are kept. It cannot claim, finish, revoke, purge, requeue
  or delete anything, nor get through a follow-up (a link, an errback, a chain's next step, a
  chord's body, a replacement) what it could not enqueue itself.
* a **worker** claims, renews, finishes, retries and reclaims tasks, enqueues follow-ups (held
  to the rules of the producer they follow), runs the scheduler, and prunes finished rows. It
  cannot purge waiting tasks, end a task it did not claim, touch dead-lettered ones (requeue
  or discard) or change the schema.
* an **administrator** owns the schema: migrations, purge, requeue, discard, everything.

Table privileges say which statements a role may run; row-level security says which rows.
Once row-level security is on, a role given nothing here sees no task at all: give every
client role through this module. No function of the schema is executable by PUBLIC; each
role is given the few its statements call. The roles themselves must exist (``CREATE ROLE
... LOGIN``); the statements run as the schema's owner or a superuser. Every statement is
built with :mod:`psycopg.sql`.
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
    "producer_rules",
    "migrations",
)
#: Every function of the schema, with its argument types.
FUNCTIONS = (
    ("notify_due", ""),
    ("notify_result", ""),
    ("enforce_quotas", ""),
    ("concurrency_key", "jsonb"),
    ("hand_off", "text, text, text"),
    # The hand-off of older versions, for their producers during an upgrade: hands off nothing.
    (
        "hand_off",
        "text, text, text, integer, integer, text, text, text, bytea, jsonb,"
        " timestamp with time zone, timestamp with time zone",
    ),
    ("wake", "text"),
    ("may_enqueue", "text, text, text, integer"),
    ("refuse_unclaimed_outcome", ""),
)
#: The functions a producer's statements call (an enqueue's hand-off and wake-up, and the
#: concurrency key of the task table's index); the trigger functions run without EXECUTE.
PRODUCER_FUNCTIONS = (
    ("concurrency_key", "jsonb"),
    ("hand_off", "text, text, text"),
    ("wake", "text"),
)
#: A worker's: a producer's, and the check of the follow-ups it enqueues.
WORKER_FUNCTIONS = (*PRODUCER_FUNCTIONS, ("may_enqueue", "text, text, text, integer"))
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
    # A single enqueue looks for a parked worker; taking one is hand_off's, which runs with
    # its owner's rights.
    "parked_workers": ("SELECT",),
    "migrations": ("SELECT",),
}
WORKER_RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: Tables a worker only reads: quotas, rules and the schema version are the admin's to change.
WORKER_READS = ("migrations", "quotas", "producer_rules")
#: Statuses whose rows a worker may delete (the pruner's; never waiting or dead-lettered ones).
FINISHED = ("COMPLETED", "FAILED", "CANCELLED")
#: Tables whose rows row-level security divides between roles (see ``statements``).
ROW_SECURED = ("tasks", "results", "chords", "group_results", "unique_keys")
#: The highest priority a producer may give (RabbitMQ's highest, and so Celery's).
MAX_PRIORITY = 255
#: The largest payload a producer may write, in bytes (the max_payload_bytes setting's default).
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024


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
    #: Producers' rows have a priority from 0 to this.
    max_priority: int = MAX_PRIORITY
    #: Producers' rows carry at most this many bytes of payload (and of headers).
    max_payload_bytes: int = MAX_PAYLOAD_BYTES


def _rights(names: Sequence[str]) -> sql.Composed:
    """Privilege keywords (from the constants above) as SQL."""
    return sql.SQL(", ").join(sql.SQL(name) for name in names)


def _policy(kind: str, role: str) -> sql.Identifier:
    return sql.Identifier(f"pgtasks_{kind}_{role}"[:63])


def _names_check(patterns: Sequence[str], column: str = "name", suffix: str = "") -> sql.Composable:
    """``column`` matches one of ``patterns`` (exact names, or ``prefix.*``); with ``suffix``,
    ``column`` starts with such a name followed by ``suffix`` (a unique key's task name)."""
    col = sql.Identifier(column)
    exact = [p for p in patterns if not p.endswith("*")]
    prefixes = [p[:-1] for p in patterns if p.endswith("*")]
    parts: list[sql.Composable] = []
    if exact and not suffix:
        parts.append(sql.SQL("{} = ANY({})").format(col, sql.Literal(exact)))
    for name in exact if suffix else ():
        parts.append(sql.SQL("starts_with({}, {})").format(col, sql.Literal(name + suffix)))
    for prefix in prefixes:
        parts.append(sql.SQL("starts_with({}, {})").format(col, sql.Literal(prefix)))
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts)) if parts else sql.SQL("false")


def _allowed_check(roles: Roles) -> sql.Composable:
    """A producer's queues and task names, as a condition on a task row."""
    checks: list[sql.Composable] = []
    if roles.queues is not None:
        checks.append(sql.SQL("queue = ANY({})").format(sql.Literal(list(roles.queues))))
    if roles.task_names is not None:
        checks.append(_names_check(roles.task_names))
    return sql.SQL(" AND ").join(checks) if checks else sql.SQL("true")


def _producer_check(roles: Roles) -> sql.Composable:
    """What a producer's row must be: a waiting row that nobody has touched, of the
    producer's own source, queues and task names, within its priority and size bounds. What
    it could not write directly it cannot get through a follow-up either (the worker's
    policy holds follow-ups to the rules of the source they follow)."""
    most = sql.Literal(roles.max_payload_bytes)
    return sql.SQL(" AND ").join(
        [
            sql.SQL(
                "status = 'PENDING' AND attempt = 0 AND retries = 0 AND requeued_attempt = 0"
                " AND claimed_by IS NULL AND lease_until IS NULL AND NOT cancel_requested"
                " AND error IS NULL AND traceback IS NULL"
            ),
            # Its own source: quotas count by it, and follow-ups inherit it.
            sql.SQL("source = current_user::text"),
            sql.SQL("priority BETWEEN 0 AND {}").format(sql.Literal(roles.max_priority)),
            # A start time that a claim's rate limit gave: never the producer's to write.
            sql.SQL("NOT (headers ? 'rate_slot')"),
            # A unique key is held per task name ("name:key"): only of the producer's tasks.
            sql.SQL("(unique_key IS NULL OR starts_with(unique_key, name || ':'))"),
            sql.SQL(
                "COALESCE(pg_column_size(payload), 0) + COALESCE(pg_column_size(payload_raw), 0)"
                " <= {} AND pg_column_size(headers) <= {}"
            ).format(most, most),
            _allowed_check(roles),
        ]
    )


def _rules(schema: sql.Identifier, producer: str, roles: Roles) -> sql.Composed:
    """The producer's row of producer_rules, which the workers' policy reads."""
    return sql.SQL(
        "INSERT INTO {}.producer_rules (role, queues, names, max_priority)"
        " VALUES ({}, {}::text[], {}::text[], {})"
        " ON CONFLICT (role) DO UPDATE"
        " SET queues = EXCLUDED.queues, names = EXCLUDED.names,"
        " max_priority = EXCLUDED.max_priority, updated_at = now()"
    ).format(
        schema,
        sql.Literal(producer),
        sql.Literal(None if roles.queues is None else list(roles.queues)),
        sql.Literal(None if roles.task_names is None else list(roles.task_names)),
        sql.Literal(roles.max_priority),
    )


def statements(schema: str, roles: Roles) -> list[sql.Composed]:
    """The statements giving ``roles`` their rights in ``schema`` (idempotent: run again with
    other queues or names, a role's policies are replaced)."""
    if not 0 <= roles.max_priority < 2**31:
        raise ValueError("max_priority must be from 0 to 2147483647")
    if roles.max_payload_bytes <= 0:
        raise ValueError("max_payload_bytes must be positive")
    s = sql.Identifier(schema)

    def table(name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(s, sql.Identifier(name))

    def function(name: str, args: str) -> sql.Composable:
        return sql.SQL("{}.{}({})").format(s, sql.Identifier(name), sql.SQL(args))

    tasks = table("tasks")
    out: list[sql.Composed] = []
    for admin in roles.admins:
        role = sql.Identifier(admin)
        out.append(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(s, role))
        for name in TABLES:
            out.append(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table(name), role))
        for name, args in FUNCTIONS:
            out.append(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(function(name, args), role))
    clients = [*roles.producers, *roles.workers]
    for client in clients:
        out.append(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, sql.Identifier(client)))
    for producer in roles.producers:
        role = sql.Identifier(producer)
        for name in TABLES:
            out.append(sql.SQL("REVOKE ALL ON {} FROM {}").format(table(name), role))
        for name, args in FUNCTIONS:
            out.append(
                sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(function(name, args), role)
            )
        for name, rights in PRODUCER_TABLES.items():
            out.append(sql.SQL("GRANT {} ON {} TO {}").format(_rights(rights), table(name), role))
        for name, args in PRODUCER_FUNCTIONS:
            out.append(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(function(name, args), role)
            )
        out.append(_rules(s, producer, roles))
    for worker in roles.workers:
        role = sql.Identifier(worker)
        for name in TABLES:
            rights = ("SELECT",) if name in WORKER_READS else WORKER_RIGHTS
            out.append(sql.SQL("GRANT {} ON {} TO {}").format(_rights(rights), table(name), role))
        for name, args in WORKER_FUNCTIONS:
            out.append(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(function(name, args), role)
            )
    if clients:
        for name in ROW_SECURED:
            out.append(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table(name)))
    allowed = _allowed_check(roles)
    for producer in roles.producers:
        role = sql.Identifier(producer)
        # Reads: the rows of the queues and task names it may enqueue (its own tasks, their
        # follow-ups, and the holders of the unique keys it may take), and their results
        # while the task's row is kept.
        out += _replace_policy(
            tasks, _policy("read", producer), sql.SQL("SELECT"), role, using=allowed
        )
        out += _replace_policy(
            tasks,
            _policy("enqueue", producer),
            sql.SQL("INSERT"),
            role,
            check=_producer_check(roles),
        )
        out += _replace_policy(
            table("results"),
            _policy("results", producer),
            sql.SQL("SELECT"),
            role,
            using=sql.SQL("EXISTS (SELECT 1 FROM {} AS t WHERE t.id = task_id)").format(tasks),
        )
        own = sql.SQL("source = current_user::text")
        out += _replace_policy(
            table("chords"), _policy("chords", producer), sql.SQL("INSERT"), role, check=own
        )
        out += _replace_policy(
            table("group_results"),
            _policy("groups", producer),
            sql.SQL("ALL"),
            role,
            using=own,
            check=own,
        )
        keys = (
            sql.SQL("true")
            if roles.task_names is None
            else _names_check(roles.task_names, column="key", suffix=":")
        )
        out += _replace_policy(
            table("unique_keys"),
            _policy("keys", producer),
            sql.SQL("ALL"),
            role,
            using=keys,
            check=keys,
        )
    for worker in roles.workers:
        role = sql.Identifier(worker)
        out += _replace_policy(
            tasks, _policy("read", worker), sql.SQL("SELECT"), role, using=sql.SQL("true")
        )
        # Follow-ups carry the source of the row they follow: held to that source's rules.
        # A refused one is written dead-lettered, never to run, with the reason.
        out += _replace_policy(
            tasks,
            _policy("enqueue", worker),
            sql.SQL("INSERT"),
            role,
            check=sql.SQL(
                "status = 'DEAD' OR {}.may_enqueue(source, name, queue, priority)"
            ).format(s),
        )
        # Claims, renewals, outcomes, retries and reclaims: never a dead-lettered row (and,
        # by the table's trigger, no outcome over a row that was never claimed).
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
        for name in ROW_SECURED[1:]:
            out += _replace_policy(
                table(name),
                _policy(f"work_{name}", worker),
                sql.SQL("ALL"),
                role,
                using=sql.SQL("true"),
                check=sql.SQL("true"),
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
