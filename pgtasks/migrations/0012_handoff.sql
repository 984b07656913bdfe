-- Direct hand-off. A worker whose claims find nothing due parks here (one row per worker) while
-- it waits. A single enqueue of a task that could start now takes one parked worker of its queue
-- in the same statement: the row is written RUNNING for that worker (attempt 1, under the
-- worker's lease, so fenced exactly as a claimed row) and NOTIFY sends the worker the claimed
-- row on its own channel, so the task starts without a claim's round trip.
--
-- A hand-off consumes the worker's row: a worker is handed at most one task per park. A row
-- is good until "until" (the database clock), and its worker parks again before then while it
-- stays idle, so a worker that died parked can be handed one task at most, which its lease
-- brings back like any other. Unlogged: after a crash the table is empty and idle workers park
-- again at their next poll.
CREATE UNLOGGED TABLE {schema}.parked_workers (
    worker     text        PRIMARY KEY,
    -- The channel the worker listens on for the rows handed to it.
    channel    text        NOT NULL,
    queues     text[]      NOT NULL,
    -- Tasks the worker claims the usual way only (those with a rate limit there).
    skip_names text[]      NOT NULL DEFAULT '{{}}',
    lease      float8      NOT NULL CHECK (lease > 0),
    until      timestamptz NOT NULL
);

-- Take a parked worker of p_queue for a task that can start now, and send it the row the
-- caller is inserting (in pgtasks.message.ClaimedTask's field order, timestamps as epoch
-- seconds, payload_raw in base64, then the worker; or the id alone where that would not fit a
-- notification). Returns the worker's row, or NULL when none is parked. A function, so that an
-- enqueue with no worker parked pays for one look at an empty table only (see insert_task_handoff).
CREATE FUNCTION {schema}.hand_off(
    p_id text, p_name text, p_queue text, p_priority integer, p_max_retries integer,
    p_content_type text, p_content_encoding text, p_payload text, p_payload_raw bytea,
    p_headers jsonb, p_run_at timestamptz, p_expires_at timestamptz
) RETURNS {schema}.parked_workers LANGUAGE plpgsql AS $$
DECLARE
    w {schema}.parked_workers;
    body text;
BEGIN
    DELETE FROM {schema}.parked_workers AS p
     WHERE p.worker = (SELECT q.worker FROM {schema}.parked_workers AS q
                        WHERE p_queue = ANY(q.queues) AND p_name <> ALL(q.skip_names)
                          AND q.until > now()
                        LIMIT 1
                          FOR UPDATE SKIP LOCKED)
    RETURNING p.* INTO w;
    IF w.worker IS NULL THEN
        RETURN NULL;
    END IF;
    body := json_build_array(
        p_id, p_name, p_queue, p_priority, 1, 0, p_max_retries, p_content_type,
        p_content_encoding, p_payload, encode(p_payload_raw, 'base64'), p_headers,
        extract(epoch FROM p_run_at), extract(epoch FROM p_expires_at), false,
        extract(epoch FROM now()), 0, w.worker)::text;
    IF octet_length(body) >= 7900 THEN
        body := json_build_array(p_id)::text;
    END IF;
    PERFORM pg_notify(w.channel, body);
    RETURN w;
END
$$;
