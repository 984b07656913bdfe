"""The query texts as sent: comments and indentation out, quoted text untouched, and the
long ones converted once to PostgreSQL's own placeholders."""

from __future__ import annotations

import re

import pytest

from pgtasks.sql import PSYCOPG_CACHED_LENGTH, compact, native, queries, raw_queries


def test_comments_and_indentation_go() -> None:
    text = """
        -- a whole-line comment
        SELECT a,   -- a comment after code
               b

          FROM t  -- another
    """
    assert compact(text) == "SELECT a,\nb\nFROM t"


def test_quoted_text_is_kept_as_it_is() -> None:
    text = """
        SELECT '-- not a comment', 'it''s', "odd -- name"  -- a comment
          FROM t
         WHERE x = 'two
           lines -- of text
        ' -- end
    """
    assert compact(text) == (
        "SELECT '-- not a comment', 'it''s', \"odd -- name\"\n"
        "FROM t\n"
        "WHERE x = 'two\n"
        "           lines -- of text\n"
        "        '"
    )


@pytest.mark.parametrize("text", ["SELECT $$ x $$", "SELECT /* x */ 1", "SELECT 'open"])
def test_what_the_compaction_cannot_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        compact(text)


def test_no_query_keeps_a_comment() -> None:
    for name, text in raw_queries().items():
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)
        assert "--" not in unquoted, name
        assert all(line == line.strip() for line in unquoted.splitlines()), name


def test_native_placeholders_number_each_name_once() -> None:
    query, names = native(b"SELECT %(a)s, %(b)s, %(a)s, 5 %% 2 WHERE x LIKE 'a%%'")
    assert query == b"SELECT $1, $2, $1, 5 % 2 WHERE x LIKE 'a%'"
    assert names == ("a", "b")


@pytest.mark.parametrize("query", [b"SELECT %s", b"SELECT %(a)b", b"SELECT 5 % 2"])
def test_native_refuses_other_placeholders(query: bytes) -> None:
    with pytest.raises(ValueError):
        native(query)


def test_every_long_query_converts() -> None:
    """The claims are longer than psycopg keeps converted; each converts with all its
    parameters named."""
    long = {n: q for n, q in queries("pgtasks").items() if len(q) > PSYCOPG_CACHED_LENGTH}
    assert {"claim_batch", "claim_batch_from_floors"} <= set(long)
    for name, text in long.items():
        assert isinstance(text, bytes)
        converted, names = native(text)
        assert set(names) == {m.decode() for m in re.findall(rb"%\((\w+)\)s", text)}, name
        assert b"%(" not in converted
        assert max(int(n) for n in re.findall(rb"\$(\d+)", converted)) == len(names)
