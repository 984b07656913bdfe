"""Named SQL queries, loaded once from ``queries.sql``.

pgtasks' own are this package's file; a part of the project with queries of its own (``pgtasks
bench``) keeps them in a ``queries.sql`` of its package, in the same format, and loads them
with the same functions (``queries(schema, package)``).

Each query starts with ``-- name: <name>`` followed by a one-line description. A part several
queries share word for word is written once, after ``-- fragment: <name>``, and stands in each
query (or fragment) as a line ``-- insert: <name>``. ``{schema}`` in the text is replaced by a
quoted identifier through :mod:`psycopg.sql`, so no query is ever built by pasting user input
together.

What is sent is the query without its comments and indentation: psycopg keeps the conversion
of a query to PostgreSQL's ``$1`` placeholders only for texts of up to 4 KB
(``MAX_CACHED_STATEMENT_LENGTH``), and converts a longer one again on every execution (the
claim's text is twice that with its comments).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INSERT = re.compile(r"^-- insert: (\w+)\s*$", re.MULTILINE)


@functools.cache
def raw_queries(package: str = __name__) -> dict[str, str]:
    """The query texts by name of ``package``'s ``queries.sql`` (pgtasks' own by default),
    fragments in place and ``{schema}`` still in place."""
    text = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        (queries if kind == "name" else fragments)[name] = body.strip("\n")
    for name, body in queries.items():
        # A fragment may insert another one.
        while _INSERT.search(body):
            body = _INSERT.sub(lambda m: fragments[m.group(1)], body)
        queries[name] = compact(body)
    return queries


def compact(text: str) -> str:
    """``text`` without its ``--`` comments, indentation and blank lines.

    Quoted text ('...' and "...", doubled quotes inside included) is kept as it is: a ``--``
    in it is no comment, and its spaces and line ends stay. queries.sql holds no dollar-quoted
    text and no block comments (checked).
    """
    if "$$" in text or "/*" in text:
        raise ValueError("queries.sql must hold no dollar quotes or block comments")
    out: list[str] = []
    quote = ""  # the quote character while inside quoted text, carried over line ends
    for line in text.splitlines():
        quoted_start = bool(quote)
        end = len(line)
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif line.startswith("--", i):
                end = i
                break
        code = line[:end]
        if not quoted_start:
            code = code.lstrip()
        if not quote:
            code = code.rstrip()
        if code or quoted_start or quote:
            out.append(code)
    if quote:
        raise ValueError(f"unterminated quoted text in a query: {text[:60]!r}")
    return "\n".join(out)


#: The longest query text whose conversion to ``$1`` placeholders psycopg keeps
#: (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one is converted on every
#: execution, so pgtasks converts it once itself (see ``native``).
PSYCOPG_CACHED_LENGTH = 4096

_PLACEHOLDER = re.compile(rb"%\((\w+)\)s|%%|%")


def native(query: bytes) -> tuple[bytes, tuple[str, ...]]:
    """``query`` with PostgreSQL's own placeholders (``$1``, one per name, in order of first
    use) for a ``psycopg.RawCursor``, and the parameter names in that order."""
    names: list[str] = []

    def placeholder(m: re.Match[bytes]) -> bytes:
        if m.group(0) == b"%%":
            return b"%"
        if m.group(1) is None:
            raise ValueError(f"a query may only hold %(name)s placeholders: {query[:60]!r}")
        name = m.group(1).decode("ascii")
        if name not in names:
            names.append(name)
        return b"$%d" % (names.index(name) + 1)

    return _PLACEHOLDER.sub(placeholder, query), tuple(names)


@functools.cache
def queries(schema: str, package: str = __name__) -> dict[str, bytes | sql.Composed]:
    """Every query of ``package``'s ``queries.sql`` (pgtasks' own by default) composed for
    ``schema``.

    With an ASCII schema name the queries are rendered to bytes once, which read the same in
    every client encoding; a composed query would be rendered again on every execution
    (quoting the schema through libpq each time), before psycopg's cache of converted queries.
    """
    ident = sql.Identifier(schema)
    composed = {
        name: sql.SQL(text).format(schema=ident) for name, text in raw_queries(package).items()
    }
    if not schema.isascii():
        return dict(composed)
    return {name: query.as_bytes(None) for name, query in composed.items()}
