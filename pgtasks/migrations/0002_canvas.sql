-- Canvas: chord counters, saved group results, result notifications and the children lookup.

-- One row per chord whose header has not finished. Members decrement "remaining" in the
-- transaction that records their completion; the one that reaches zero enqueues the body in
-- that same transaction and deletes the row, so the body is enqueued exactly once.
CREATE TABLE {schema}.chords (
    id          text        PRIMARY KEY,
    -- The ids whose results the body receives, in header order.
    member_ids  text[]      NOT NULL,
    remaining   integer     NOT NULL CHECK (remaining >= 0),
    -- The body's signature as Celery's dict form, its task id already assigned.
    body        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- GroupResult.save() / GroupResult.restore().
CREATE TABLE {schema}.group_results (
    id          text        PRIMARY KEY,
    result_ids  text[]      NOT NULL,
    date_done   timestamptz NOT NULL DEFAULT now()
);

-- AsyncResult.get() waits on channel pgtasks_r_<schema> instead of polling alone. One
-- notification per statement that stored results keeps the cost flat under batched
-- completions; waiters re-read their own result on any notification.
CREATE FUNCTION {schema}.notify_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify(left('pgtasks_r_' || TG_TABLE_SCHEMA, 63), '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER results_notify_insert AFTER INSERT ON {schema}.results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_result();
CREATE TRIGGER results_notify_update AFTER UPDATE ON {schema}.results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_result();

-- AsyncResult.children: the calls a task's completion enqueued (only rows that have a parent).
CREATE INDEX tasks_parent_idx ON {schema}.tasks ((headers ->> 'parent_id'))
    WHERE headers ? 'parent_id';
