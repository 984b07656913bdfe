-- The columns of tasks in a new order: the ones a claim and an outcome change at the end.
--
-- PostgreSQL logs an update whose new version stays on the old one's page (see the fillfactor
-- of 0015) as the new row less the bytes it shares with the old one at its start and at its
-- end. status, attempt, claimed_by, lease_until and updated_at used to sit among the columns
-- that never change (payload and headers among them), so every claim and every outcome logged
-- nearly the whole row again, payload included. With them last, an update logs about 60 bytes
-- of row: on rows of a no-op task, about 300 bytes less write-ahead log a task, and on larger
-- payloads twice the payload's size less.
--
-- PostgreSQL cannot move a column, so the table is built again: the old one is renamed, a new
-- one created, the rows copied, the old one dropped, and everything that was attached to it
-- (constraints, indexes, triggers, row-level security and its policies, privileges, storage
-- options, comments, extended statistics, rules, publications, replica identity) attached to
-- the new one as it was, by its own definition. This holds an exclusive lock on tasks while
-- the rows are copied: workers and producers wait for it. A column that pgtasks did not create
-- stops the migration (nothing is changed): drop it, or copy it elsewhere, first. So does an
-- object of another table that depends on tasks (a view, a foreign key): PostgreSQL names it.
DO $$
DECLARE
    ns oid := (SELECT c.relnamespace FROM pg_class AS c
                WHERE c.oid = (SELECT m.tableoid FROM {schema}.migrations AS m LIMIT 1));
    sch text := (SELECT quote_ident(n.nspname) FROM pg_namespace AS n WHERE n.oid = ns);
    tbl text := sch || '.tasks';
    old oid;
    owner oid;
    -- The new order. Never changed after the enqueue first, then what a retry or a rate limit
    -- changes, then what every claim and every outcome changes.
    cols text[] := ARRAY[
        'id', 'name', 'queue', 'priority', 'content_type', 'content_encoding', 'payload',
        'payload_raw', 'headers', 'max_retries', 'expires_at', 'created_at', 'source',
        'unique_key', 'unique_until_started', 'cancel_requested', 'requeued_attempt',
        'run_at', 'retries', 'error', 'traceback',
        'attempt', 'status', 'claimed_by', 'lease_until', 'updated_at'];
    extra text;
    replay text[] := '{{}}';
    -- The storage options, set before the rows are copied (so that fillfactor lays them out).
    storage text;
    stmt text;
    r record;
BEGIN
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', tbl);
    old := tbl::regclass;
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = old;

    SELECT string_agg(quote_ident(a.attname), ', ') INTO extra
      FROM pg_attribute AS a
     WHERE a.attrelid = old AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname <> ALL(cols);
    IF extra IS NOT NULL THEN
        RAISE EXCEPTION 'table % has columns pgtasks does not know: %', tbl, extra
            USING HINT = 'Drop them (or copy them to a table of your own) and migrate again.';
    END IF;

    -- What is attached to the table, as statements that name it, to run again on the new one.
    FOR r IN SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
              WHERE conrelid = old AND contype IN ('c', 'p', 'u', 'x', 'f')
              ORDER BY contype <> 'p', conname
    LOOP
        replay := replay || format('ALTER TABLE %s ADD CONSTRAINT %I %s', tbl, r.conname, r.def);
    END LOOP;
    FOR r IN SELECT pg_get_indexdef(i.indexrelid) AS def FROM pg_index AS i
              WHERE i.indrelid = old
                AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid
                                                                  AND k.conrelid = old)
              ORDER BY i.indexrelid
    LOOP
        replay := replay || r.def;
    END LOOP;
    FOR r IN SELECT pg_get_triggerdef(t.oid) AS def, t.tgname, t.tgenabled FROM pg_trigger AS t
              WHERE t.tgrelid = old AND NOT t.tgisinternal ORDER BY t.tgname
    LOOP
        replay := replay || r.def;
        IF r.tgenabled <> 'O' THEN
            replay := replay || format('ALTER TABLE %s %s TRIGGER %I', tbl,
                CASE r.tgenabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA'
                                 ELSE 'ENABLE ALWAYS' END, r.tgname);
        END IF;
    END LOOP;
    FOR r IN SELECT pg_get_ruledef(oid) AS def FROM pg_rewrite
              WHERE ev_class = old AND rulename <> '_RETURN'
    LOOP
        replay := replay || r.def;
    END LOOP;
    FOR r IN SELECT p.polname, p.polpermissive, p.polcmd,
                    pg_get_expr(p.polqual, p.polrelid) AS qual,
                    pg_get_expr(p.polwithcheck, p.polrelid) AS check_,
                    ARRAY(SELECT CASE WHEN g = 0 THEN 'PUBLIC' ELSE g::regrole::text END
                            FROM unnest(p.polroles) AS g) AS roles
               FROM pg_policy AS p WHERE p.polrelid = old ORDER BY p.polname
    LOOP
        replay := replay || format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s',
            r.polname, tbl, CASE WHEN r.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
            CASE r.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                          WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
            array_to_string(r.roles, ', '),
            CASE WHEN r.qual IS NOT NULL THEN ' USING (' || r.qual || ')' ELSE '' END,
            CASE WHEN r.check_ IS NOT NULL THEN ' WITH CHECK (' || r.check_ || ')' ELSE '' END);
    END LOOP;
    FOR r IN SELECT c.relrowsecurity, c.relforcerowsecurity, c.reloptions, c.relreplident,
                    obj_description(c.oid, 'pg_class') AS note
               FROM pg_class AS c WHERE c.oid = old
    LOOP
        IF r.relrowsecurity THEN
            replay := replay || format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
        END IF;
        IF r.relforcerowsecurity THEN
            replay := replay || format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
        END IF;
        IF r.reloptions IS NOT NULL THEN
            storage := format('ALTER TABLE %s SET (%s)', tbl,
                (SELECT string_agg(format('%s = %L', split_part(o, '=', 1),
                                          substr(o, strpos(o, '=') + 1)), ', ')
                   FROM unnest(r.reloptions) AS o));
        END IF;
        IF r.relreplident = 'f' THEN
            replay := replay || format('ALTER TABLE %s REPLICA IDENTITY FULL', tbl);
        ELSIF r.relreplident = 'n' THEN
            replay := replay || format('ALTER TABLE %s REPLICA IDENTITY NOTHING', tbl);
        ELSIF r.relreplident = 'i' THEN
            replay := replay || format('ALTER TABLE %s REPLICA IDENTITY USING INDEX %I', tbl,
                (SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
                  WHERE i.indrelid = old AND i.indisreplident));
        END IF;
        IF r.note IS NOT NULL THEN
            replay := replay || format('COMMENT ON TABLE %s IS %L', tbl, r.note);
        END IF;
    END LOOP;
    FOR r IN SELECT a.attname, col_description(old, a.attnum) AS note FROM pg_attribute AS a
              WHERE a.attrelid = old AND a.attnum > 0 AND NOT a.attisdropped
                AND col_description(old, a.attnum) IS NOT NULL
    LOOP
        replay := replay || format('COMMENT ON COLUMN %s.%I IS %L', tbl, r.attname, r.note);
    END LOOP;
    FOR r IN SELECT pg_get_statisticsobjdef(oid) AS def FROM pg_statistic_ext WHERE stxrelid = old
    LOOP
        replay := replay || r.def;
    END LOOP;
    FOR r IN SELECT p.pubname FROM pg_publication_rel AS pr
               JOIN pg_publication AS p ON p.oid = pr.prpubid WHERE pr.prrelid = old
    LOOP
        replay := replay || format('ALTER PUBLICATION %I ADD TABLE %s', r.pubname, tbl);
    END LOOP;
    -- Privileges on the table and on its columns, with their grant options.
    FOR r IN SELECT a.privilege_type, a.grantee, a.is_grantable, NULL::name AS col
               FROM pg_class AS c, aclexplode(c.relacl) AS a
              WHERE c.oid = old AND a.grantee <> c.relowner
             UNION ALL
             SELECT a.privilege_type, a.grantee, a.is_grantable, t.attname
               FROM pg_attribute AS t, aclexplode(t.attacl) AS a
              WHERE t.attrelid = old AND t.attnum > 0 AND NOT t.attisdropped
                AND t.attacl IS NOT NULL AND a.grantee <> owner
    LOOP
        replay := replay || format('GRANT %s%s ON %s TO %s%s', r.privilege_type,
            CASE WHEN r.col IS NOT NULL THEN format(' (%I)', r.col) ELSE '' END, tbl,
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END,
            CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;

    EXECUTE format('ALTER TABLE %s RENAME TO tasks_before_0016', tbl);
    EXECUTE format($create$
        CREATE TABLE %s (
            id                   text        NOT NULL,
            name                 text        NOT NULL,
            queue                text        NOT NULL DEFAULT 'celery',
            priority             integer     NOT NULL DEFAULT 0,
            content_type         text        NOT NULL DEFAULT 'application/json',
            content_encoding     text        NOT NULL DEFAULT 'utf-8',
            payload              json,
            payload_raw          bytea,
            headers              jsonb       NOT NULL DEFAULT '{{}}',
            max_retries          integer,
            expires_at           timestamptz,
            created_at           timestamptz NOT NULL DEFAULT now(),
            source               text        NOT NULL
                DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''),
                                 CURRENT_USER::text),
            unique_key           text,
            unique_until_started boolean     NOT NULL DEFAULT false,
            cancel_requested     boolean     NOT NULL DEFAULT false,
            requeued_attempt     integer     NOT NULL DEFAULT 0,
            run_at               timestamptz NOT NULL DEFAULT now(),
            retries              integer     NOT NULL DEFAULT 0,
            error                text,
            traceback            text,
            attempt              integer     NOT NULL DEFAULT 0,
            status               text        NOT NULL DEFAULT 'PENDING',
            claimed_by           text,
            lease_until          timestamptz,
            updated_at           timestamptz NOT NULL DEFAULT now()
        )$create$, tbl);
    IF owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('ALTER TABLE %s OWNER TO %s', tbl, owner::regrole::text);
    END IF;
    IF storage IS NOT NULL THEN
        EXECUTE storage;
    END IF;
    EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM %s.tasks_before_0016',
        tbl, array_to_string(cols, ', '), array_to_string(cols, ', '), sch);
    EXECUTE format('DROP TABLE %s.tasks_before_0016', sch);
    FOREACH stmt IN ARRAY replay LOOP
        EXECUTE stmt;
    END LOOP;
    EXECUTE format('ANALYZE %s', tbl);
END
$$;
