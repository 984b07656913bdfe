-- Quotas count a source's waiting tasks: BLOCKED ones (held back by a concurrency limit) wait
-- too. The trigger counts both, and so does its index, rebuilt where a quota is set (it exists
-- only then, see pgtasks.quotas).
CREATE OR REPLACE FUNCTION {schema}.enforce_quotas() RETURNS trigger LANGUAGE plpgsql AS $$
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
                 WHERE t.source = q.source AND t.status IN ('PENDING', 'BLOCKED')
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

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.quotas) THEN
        DROP INDEX IF EXISTS {schema}.tasks_source_pending_idx;
        CREATE INDEX tasks_source_pending_idx ON {schema}.tasks (source)
            WHERE status IN ('PENDING', 'BLOCKED');
    END IF;
END
$$;
