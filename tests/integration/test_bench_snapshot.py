"""``pgtasks bench --hold-snapshot``: the steady phase runs beside an open transaction whose
snapshot holds back the xmin horizon, as a long report query would."""

from __future__ import annotations

from typing import Any

import psycopg

from pgtasks.cli.bench.load import held_snapshot
from pgtasks.cli.bench.options import Options


def held_horizons(db: psycopg.Connection[Any]) -> list[Any]:
    """Sessions other than ``db``'s that pin the xmin horizon the way the bench does (other
    tests running beside this one open short transactions of their own)."""
    found = db.execute(
        "SELECT backend_xmin FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid() AND state = 'idle in transaction'"
        "   AND backend_xmin IS NOT NULL AND datname = current_database()"
        "   AND query = 'SELECT txid_current()'"
    ).fetchall()
    return [row[0] for row in found]


def test_hold_snapshot_keeps_a_transaction_open_for_the_block(
    pg_dsn: str, db: psycopg.Connection[Any]
) -> None:
    before = held_horizons(db)
    with held_snapshot(Options(database_url=pg_dsn, hold_snapshot=True)) as held:
        assert held is True
        assert len(held_horizons(db)) == len(before) + 1
    assert len(held_horizons(db)) == len(before)
    with held_snapshot(Options(database_url=pg_dsn)) as held:
        assert held is False
        assert len(held_horizons(db)) == len(before)
