"""The schema as one file (``schema.sql``), and the check that the migrations add up to it.

``schema.sql`` is written by hand for readers; nothing at run time loads it. What keeps it true
is a comparison read from PostgreSQL's catalogs: one fresh schema is migrated, another is built
from ``schema.sql``, and the two are described (columns, constraints, indexes, triggers,
functions, policies, privileges, table options, sequences, types, comments, versions) with the
schema's name taken out. ``tests/integration/test_schema_snapshot.py`` runs it with the tests;
a maintainer who writes a migration can run it alone::

    python -m pgtasks.sql.snapshot --check --dsn postgresql://localhost/scratch

It prints how the two differ (``-`` the migrations, ``+`` schema.sql) and exits 1 when they do.
``--describe`` prints the description of a freshly migrated schema, to write the file from.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from pgtasks.broker import notify_channel
from pgtasks.migrate import migrate

#: Stands for the schema's name in a description, so that two schemas compare.
PLACEHOLDER = "{schema}"


def text() -> str:
    """``schema.sql`` as written, placeholders in place."""
    return resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")


def load(conn: psycopg.Connection[Any], schema: str) -> None:
    """Build ``schema`` from ``schema.sql``, in one transaction. The schema must not hold
    pgtasks' tables yet (it may not exist)."""
    body = sql.SQL(text()).format(
        schema=sql.Identifier(schema), channel=sql.Literal(notify_channel(schema))
    )
    with conn.transaction():
        conn.execute(body)


# Each query takes the schema's name as %(schema)s (quoted as an identifier: %(nsp)s) and
# returns (section, name, detail) rows; a description is every row, sorted, then its lines.
# Oids never appear in a line, only names and PostgreSQL's own renderings of definitions.
_DESCRIBE = {
    "objects": """
        SELECT 'object', o.type || ' ' || o.identity, ''
          FROM pg_depend AS d, pg_identify_object(d.classid, d.objid, d.objsubid) AS o
         WHERE d.refclassid = 'pg_namespace'::regclass
           AND d.refobjid = %(nsp)s::regnamespace AND d.deptype = 'n'
    """,
    "schema": """
        SELECT 'schema', n.nspname,
               'acl ' || COALESCE(n.nspacl::text, 'default')
          FROM pg_namespace AS n WHERE n.oid = %(nsp)s::regnamespace
    """,
    "relations": """
        SELECT 'relation', c.relname,
               format('kind %%s, persistence %%s, options %%s, tablespace %%s, row security %%s,'
                      ' forced %%s, replica identity %%s, partition key %%s, acl %%s',
                      c.relkind, c.relpersistence, COALESCE(c.reloptions::text, 'none'),
                      COALESCE(t.spcname, 'default'), c.relrowsecurity,
                      c.relforcerowsecurity, c.relreplident,
                      COALESCE(pg_get_partkeydef(c.oid), 'none'),
                      COALESCE(c.relacl::text, 'default'))
          FROM pg_class AS c LEFT JOIN pg_tablespace AS t ON t.oid = c.reltablespace
         WHERE c.relnamespace = %(nsp)s::regnamespace
    """,
    "columns": """
        SELECT 'column', c.relname || '.' || lpad(
                   (row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum))::text, 3, '0'),
               concat_ws(' ', quote_ident(a.attname), format_type(a.atttypid, a.atttypmod),
                   CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                   'DEFAULT ' || pg_get_expr(d.adbin, d.adrelid),
                   CASE a.attgenerated WHEN 's' THEN 'GENERATED' END,
                   CASE a.attidentity WHEN 'a' THEN 'IDENTITY ALWAYS'
                                      WHEN 'd' THEN 'IDENTITY BY DEFAULT' END,
                   CASE WHEN a.attcollation <> ty.typcollation
                        THEN 'COLLATE ' || a.attcollation::regcollation::text END,
                   CASE WHEN a.attstorage <> ty.typstorage
                        THEN 'STORAGE ' || a.attstorage::text END,
                   CASE WHEN a.attcompression <> ''
                        THEN 'COMPRESSION ' || a.attcompression::text END,
                   CASE WHEN a.attstattarget >= 0
                        THEN 'STATISTICS ' || a.attstattarget END,
                   'ACL ' || a.attacl::text)
          FROM pg_class AS c
          JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          JOIN pg_type AS ty ON ty.oid = a.atttypid
          LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum
         WHERE c.relnamespace = %(nsp)s::regnamespace AND c.relkind NOT IN ('i', 'I')
    """,
    "constraints": """
        SELECT 'constraint',
               COALESCE(c.relname, ty.typname) || '.' || k.conname,
               pg_get_constraintdef(k.oid)
          FROM pg_constraint AS k
          LEFT JOIN pg_class AS c ON c.oid = k.conrelid
          LEFT JOIN pg_type AS ty ON ty.oid = k.contypid
         WHERE k.connamespace = %(nsp)s::regnamespace
           -- PostgreSQL 18 keeps NOT NULL as named constraints, whose names depend on the
           -- order things were built in; nullability is described with the columns.
           AND k.contype <> 'n'
    """,
    "indexes": """
        SELECT 'index', c.relname,
               pg_get_indexdef(i.indexrelid)
               || CASE WHEN i.indisclustered THEN ' CLUSTERED' ELSE '' END
               || CASE WHEN i.indisreplident THEN ' REPLICA IDENTITY' ELSE '' END
               || CASE WHEN NOT i.indisvalid THEN ' INVALID' ELSE '' END
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE c.relnamespace = %(nsp)s::regnamespace
    """,
    "triggers": """
        SELECT 'trigger', c.relname || '.' || t.tgname,
               pg_get_triggerdef(t.oid) || ' (enabled ' || t.tgenabled::text || ')'
          FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %(nsp)s::regnamespace AND NOT t.tgisinternal
    """,
    "rules": """
        SELECT 'rule', c.relname || '.' || r.rulename, pg_get_ruledef(r.oid)
          FROM pg_rewrite AS r JOIN pg_class AS c ON c.oid = r.ev_class
         WHERE c.relnamespace = %(nsp)s::regnamespace AND r.rulename <> '_RETURN'
    """,
    "views": """
        SELECT 'view', c.relname, pg_get_viewdef(c.oid)
          FROM pg_class AS c
         WHERE c.relnamespace = %(nsp)s::regnamespace AND c.relkind IN ('v', 'm')
    """,
    "policies": """
        SELECT 'policy', p.tablename || '.' || p.policyname,
               format('%%s FOR %%s TO %%s USING (%%s) WITH CHECK (%%s)', p.permissive, p.cmd,
                      p.roles::text, p.qual, p.with_check)
          FROM pg_policies AS p WHERE p.schemaname = %(schema)s
    """,
    "statistics": """
        SELECT 'statistics', s.stxname, pg_get_statisticsobjdef(s.oid)
          FROM pg_statistic_ext AS s WHERE s.stxnamespace = %(nsp)s::regnamespace
    """,
    "sequences": """
        SELECT 'sequence', c.relname,
               format('%%s start %%s increment %%s min %%s max %%s cache %%s cycle %%s',
                      format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin,
                      s.seqmax, s.seqcache, s.seqcycle)
          FROM pg_sequence AS s JOIN pg_class AS c ON c.oid = s.seqrelid
         WHERE c.relnamespace = %(nsp)s::regnamespace
    """,
    "types": """
        SELECT 'type', t.typname,
               format('type %%s, base %%s, labels %%s', t.typtype,
                      CASE WHEN t.typbasetype <> 0 THEN format_type(t.typbasetype, t.typtypmod)
                      END,
                      (SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                         FROM pg_enum AS e WHERE e.enumtypid = t.oid))
          FROM pg_type AS t
         WHERE t.typnamespace = %(nsp)s::regnamespace
           -- A table's row type and the array types are described by what they belong to.
           AND (t.typrelid = 0
                OR (SELECT c.relkind FROM pg_class AS c WHERE c.oid = t.typrelid) = 'c')
           AND NOT EXISTS (SELECT 1 FROM pg_type AS e WHERE e.typarray = t.oid)
    """,
    "functions": """
        SELECT 'function', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               format('kind %%s, volatility %%s, parallel %%s, strict %%s, security definer %%s,'
                      ' leakproof %%s, config %%s, acl %%s' || chr(10) || '%%s',
                      p.prokind, p.provolatile, p.proparallel, p.proisstrict, p.prosecdef,
                      p.proleakproof, COALESCE(p.proconfig::text, 'none'),
                      COALESCE(p.proacl::text, 'default'),
                      CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
                           ELSE pg_get_function_result(p.oid) END)
          FROM pg_proc AS p WHERE p.pronamespace = %(nsp)s::regnamespace
    """,
    "comments": """
        SELECT 'comment', o.type || ' ' || o.identity, d.description
          FROM pg_description AS d,
               pg_identify_object(d.classoid, d.objoid, d.objsubid) AS o
         WHERE o.schema = %(schema)s
            OR (d.classoid = 'pg_namespace'::regclass
                AND d.objoid = %(nsp)s::regnamespace)
            OR (d.classoid IN ('pg_trigger'::regclass, 'pg_policy'::regclass,
                               'pg_rewrite'::regclass, 'pg_constraint'::regclass)
                AND o.identity LIKE '%%' || quote_ident(%(schema)s) || '.%%')
    """,
}


def describe(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The lines that describe ``schema`` from the catalogs, its name replaced by
    ``{schema}``: equal for two schemas built alike, whatever their names."""
    rows: list[tuple[str, str, str]] = []
    params = {"schema": schema, "nsp": sql.Identifier(schema).as_string(conn)}
    for query in _DESCRIBE.values():
        rows.extend(conn.execute(query, params).fetchall())
    versions = conn.execute(
        sql.SQL("SELECT version, name FROM {}.migrations").format(sql.Identifier(schema))
    ).fetchall()
    rows.extend(("version", f"{v:04d}", name) for v, name in versions)
    lines: list[str] = []
    for section, name, detail in sorted(rows):
        head, *rest = detail.rstrip("\n").split("\n")
        lines.append(f"{section} {name}: {head}" if head else f"{section} {name}")
        # A definition over several lines names its object on each, for a readable diff.
        lines.extend(f"{section} {name} | {line}".rstrip() for line in rest)
    return [line.replace(schema, PLACEHOLDER) for line in lines]


def diff(from_migrations: Sequence[str], from_snapshot: Sequence[str]) -> list[str]:
    """A unified diff of two descriptions (empty when they are equal)."""
    return list(
        difflib.unified_diff(
            from_migrations,
            from_snapshot,
            "migrations",
            "schema.sql",
            n=2,
            lineterm="",
        )
    )


@contextmanager
def _scratch_schemas(dsn: str) -> Iterator[tuple[str, str]]:
    """Two new schema names (migrated, snapshot), dropped with all they hold afterwards."""
    tag = uuid.uuid4().hex[:12]
    names = (f"snapshot_m_{tag}", f"snapshot_s_{tag}")
    try:
        yield names
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


def compare(dsn: str) -> tuple[list[str], list[str]]:
    """Describe a schema built by the migrations and one built from ``schema.sql``, both in
    new scratch schemas of ``dsn`` that are dropped afterwards."""
    with _scratch_schemas(dsn) as (migrated, loaded):
        migrate(dsn, migrated)
        with psycopg.connect(dsn, autocommit=True) as conn:
            load(conn, loaded)
            return describe(conn, migrated), describe(conn, loaded)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pgtasks.sql.snapshot",
        description="Check that pgtasks/sql/schema.sql builds what the migrations build.",
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PGTASKS_TEST_DSN") or os.environ.get("PGTASKS_DATABASE_URL"),
        help="a database to build two scratch schemas in (default: $PGTASKS_TEST_DSN, "
        "else $PGTASKS_DATABASE_URL)",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="compare; exit 1 on a difference")
    action.add_argument(
        "--describe", action="store_true", help="print the description of a migrated schema"
    )
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("no database: pass --dsn or set PGTASKS_TEST_DSN")
    from_migrations, from_snapshot = compare(args.dsn)
    if args.describe:
        print("\n".join(from_migrations))
        return 0
    changes = diff(from_migrations, from_snapshot)
    if changes:
        print("\n".join(changes))
        print("\nschema.sql differs from what the migrations build (- migrations, + schema.sql)")
        return 1
    print(f"schema.sql builds what the migrations build ({len(from_migrations)} lines compared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
