"""What a starting worker checks before it claims: the schema is the one the code expects
(migrated first where asked), and the limits and settings that would quietly not hold here
are said so in the log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks import migrate as migrations

if TYPE_CHECKING:
    from pgtasks.app import Celery


def prepare_schema(app: Celery, migrate: bool, log: Any) -> None:
    """Apply the migrations not applied yet where ``migrate``; then check the schema is the
    one this code expects (raising where it is not)."""
    s = app.settings
    url = app.database_url
    if migrate:
        for m in migrations.migrate(url, s.schema_name):
            log.info("schema.migrated", version=m.version, name=m.name)
    migrations.check(url, s.schema_name)


def warn_unenforced_limits(app: Celery, pool: str, time_limit: float | None, log: Any) -> None:
    """Hard time limits need a process to kill: say so when the pool runs threads."""
    if pool == "prefork":
        return
    limited = [n for n, t in app.tasks.items() if getattr(t, "time_limit", None)]
    if time_limit or limited:
        log.warning(
            "worker.time_limit_unenforced",
            pool=pool,
            time_limit=time_limit,
            tasks=limited,
            hint="hard time limits are enforced by the prefork pool only (a thread cannot "
            "be killed); soft time limits still raise SoftTimeLimitExceeded",
        )


def warn_autovacuum_off(app: Celery, log: Any) -> None:
    """Every claim and outcome leaves a dead row version that only vacuum makes reusable:
    say so when autovacuum is off for the queue's tables."""
    try:
        off = app.broker.autovacuum_off()
    except psycopg.Error as exc:
        log.debug("worker.autovacuum_unknown", error=str(exc).strip())
        return
    if off:
        log.warning(
            "worker.autovacuum_off",
            schema=app.broker.schema,
            hint="autovacuum is off on this server or for the queue's tables: their dead "
            "rows are never reclaimed, so the tables grow for as long as tasks run and "
            "claims slow down; turn it on, or VACUUM the tables often (see "
            "docs/operating.md)",
        )
