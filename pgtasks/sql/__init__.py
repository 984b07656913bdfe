"""Named SQL queries, loaded once from ``queries.sql``.

Each query starts with ``-- name: <name>`` followed by a one-line description. ``{schema}`` in
the text is replaced by a quoted identifier through :mod:`psycopg.sql`, so no query is ever built
by pasting strings together.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def raw_queries() -> dict[str, str]:
    """The query texts by name, with ``{schema}`` still in place."""
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


@functools.cache
def queries(schema: str) -> dict[str, bytes | sql.Composed]:
    """Every query composed for ``schema``.

    With an ASCII schema name the queries are rendered to bytes once, which read the same in
    every client encoding; a composed query would be rendered again on every execution
    (quoting the schema through libpq each time), before psycopg's cache of converted queries.
    """
    ident = sql.Identifier(schema)
    composed = {name: sql.SQL(text).format(schema=ident) for name, text in raw_queries().items()}
    if not schema.isascii():
        return dict(composed)
    return {name: query.as_bytes(None) for name, query in composed.items()}
