-- Quotas: a bound on how many waiting tasks one source may have (pgtasks quota).

-- Who enqueued a row: the session's pgtasks.source (an app's task_source setting), else its
-- database role. Rows written before this migration count as the migrating role's.
ALTER TABLE {schema}.tasks ADD COLUMN source text NOT NULL
    DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''), current_user);

CREATE TABLE {schema}.quotas (
    source      text        PRIMARY KEY,
    max_pending bigint      NOT NULL CHECK (max_pending >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Refuse an insert that leaves a source with more waiting tasks than its quota. The trigger
-- (and the index it counts with) exist only while some quota is set, so that enqueueing pays
-- nothing for quotas nobody uses: see pgtasks.quotas. Concurrent inserts of one source can
-- each pass before the other commits, so a quota can be exceeded by what is in flight.
CREATE FUNCTION {schema}.enforce_quotas() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q record;
    waiting bigint;
BEGIN
    FOR q IN SELECT quota.source, quota.max_pending
               FROM {schema}.quotas AS quota
              WHERE quota.source IN (SELECT DISTINCT n.source FROM new_rows AS n)
    LOOP
        SELECT count(*) INTO waiting
          FROM (SELECT 1 FROM {schema}.tasks AS t
                 WHERE t.source = q.source AND t.status = 'PENDING'
                 LIMIT q.max_pending + 1) AS w;
        IF waiting > q.max_pending THEN
            RAISE EXCEPTION 'source % may have at most % waiting tasks', q.source, q.max_pending
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'wait for workers to catch up, or raise the quota: '
                             'pgtasks quota set ' || q.source || ' N';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
