"""Named SQL queries, loaded once from ``queries.sql``.

Each query starts with ``-- name: <name>`` followed by a one-line description. A part several
queries share word for word is written once, after ``-- fragment: <name>``, and stands in each
query (or fragment) as a line ``-- insert: <name>``. ``{schema}`` in the text is replaced by a
quoted identifier through :mod:`psycopg.sql`, so no query is ever built by pasting user input
together.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INSERT = re.compile(r"^-- insert: (\w+)\s*$", re.MULTILINE)


@functools.cache
def raw_queries() -> dict[str, str]:
    """The query texts by name, fragments in place and ``{schema}`` still in place."""
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        (queries if kind == "name" else fragments)[name] = body.strip("\n")
    for name, body in queries.items():
        # A fragment may insert another one.
        while _INSERT.search(body):
            body = _INSERT.sub(lambda m: fragments[m.group(1)], body)
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
