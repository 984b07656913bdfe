-- Global concurrency limits: at most N tasks RUNNING at once per key, across every worker.
-- A limited row carries its key and its limit in its headers (concurrency_key,
-- concurrency_limit), written by the producer. A claim counts the RUNNING rows of each key in
-- concurrency_limits (the key's row is locked by the claim's upsert, so claims of one key decide
-- one after the other on its latest count); a row over the limit is not started but set BLOCKED,
-- out of the claim index, until a RUNNING row of its key finishes and a worker moves it back to
-- PENDING. Every fenced statement that ends a RUNNING row gives its key's count back.
ALTER TABLE {schema}.tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE {schema}.tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('PENDING', 'BLOCKED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'DEAD'));

-- The key a row's RUNNING count is kept under: its concurrency_key, when its
-- concurrency_limit is a whole number from 1 (a row with anything else there is not limited).
-- Claims, and every statement that ends a RUNNING row, decide with this one definition.
CREATE FUNCTION {schema}.concurrency_key(headers jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(headers -> 'concurrency_key') = 'string'
                 AND headers ->> 'concurrency_limit' ~ '^[1-9][0-9]*$'
                 AND length(headers ->> 'concurrency_limit') <= 9
                THEN headers ->> 'concurrency_key' END
$$;

-- running: this key's RUNNING rows. granted: how many rows the latest claim started (read
-- back by that claim only).
CREATE TABLE {schema}.concurrency_limits (
    key         text        PRIMARY KEY,
    max_running integer     NOT NULL CHECK (max_running > 0),
    running     integer     NOT NULL DEFAULT 0 CHECK (running >= 0),
    granted     integer     NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Blocked rows of a key in claim order: the next to move back to PENDING.
CREATE INDEX tasks_blocked_idx
    ON {schema}.tasks ((headers ->> 'concurrency_key'), priority DESC, run_at, created_at)
    WHERE status = 'BLOCKED';

-- Due rows under a limit, by key: when a claim finds a key full, it sets the key's other due
-- rows BLOCKED too, a batch at a time (rows without a limit are not in this index).
CREATE INDEX tasks_limited_idx ON {schema}.tasks ({schema}.concurrency_key(headers), run_at)
    WHERE status = 'PENDING' AND {schema}.concurrency_key(headers) IS NOT NULL;

-- A blocked row still holds its unique key: it waits, and has not started.
DROP INDEX {schema}.tasks_unique_key_idx;
CREATE UNIQUE INDEX tasks_unique_key_idx ON {schema}.tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND CASE WHEN unique_until_started THEN status IN ('PENDING', 'BLOCKED') AND attempt = 0
               ELSE status IN ('PENDING', 'BLOCKED', 'RUNNING') END;


-- Every claim writes concurrency_limits: roles that claim tasks today (given UPDATE on
-- rate_limits, as `pgtasks grants` gives worker roles) get the same rights on it, so their
-- workers go on claiming after this upgrade without running `pgtasks grants` again.
DO $$
DECLARE
    ns oid := (SELECT c.relnamespace FROM pg_class AS c
                WHERE c.oid = (SELECT m.tableoid FROM {schema}.migrations AS m LIMIT 1));
    target text := (SELECT c.oid::regclass::text FROM pg_class AS c
                     WHERE c.relnamespace = ns AND c.relname = 'concurrency_limits');
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole::text AS role
               FROM pg_class AS c, aclexplode(c.relacl) AS a
              WHERE c.relnamespace = ns AND c.relname = 'rate_limits'
                AND a.privilege_type = 'UPDATE' AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s', target, r.role);
    END LOOP;
END
$$;
