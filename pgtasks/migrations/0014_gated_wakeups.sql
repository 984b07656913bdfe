-- Wake-ups only where a worker waits. PostgreSQL serializes the commits of every transaction
-- that notifies (a cluster-wide lock taken before the commit record is written and released
-- after it is flushed), so a NOTIFY on every single enqueue made concurrent producers commit
-- one at a time. Busy workers do not need the wake-up (they claim again as their tasks end),
-- so a single enqueue outside a transaction now notifies only while a worker of its queue
-- waits (see wake and insert_task_handoff).
--
-- A waiting worker has a row in parked_workers: taking hand-offs (handoff), or only woken by
-- notifications (a worker that takes none, or one that went back to work in the last
-- seconds). An advisory lock (0x70677467, hashtext of the schema's channel) closes the race
-- between an enqueue that finds no row and a worker that parks: the enqueue looks for rows
-- holding it shared until its commit, and a park takes it exclusive, so the park commits after
-- every enqueue that looked before it, and the worker's claim after parking finds their rows.
-- Enqueues that look after the park see its row and notify. Inside a caller's transaction
-- (whose commit may come long after) and in bulk (one notification a statement) enqueues
-- notify as before, from the trigger.
ALTER TABLE {schema}.parked_workers ADD COLUMN handoff boolean NOT NULL DEFAULT true;

-- Statements that wake workers themselves (see wake) set pgtasks.gated for their transaction:
-- the trigger does not fire for them (a WHEN on the statement, so no function call either).
DROP TRIGGER tasks_notify_insert ON {schema}.tasks;
CREATE TRIGGER tasks_notify_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('pgtasks.gated', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {schema}.notify_due({channel});

-- Wake the workers of p_queue for a due row the caller is inserting, if one waits: under the
-- gate's lock (held shared until the caller commits), a look at parked_workers with a snapshot
-- taken after it. True when it notified.
CREATE FUNCTION {schema}.wake(p_queue text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'70677467'::int, hashtext({channel}));
    IF EXISTS (SELECT 1 FROM {schema}.parked_workers
                WHERE p_queue = ANY(queues) AND until > now()) THEN
        PERFORM pg_notify({channel}, p_queue);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.hand_off(
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
                        WHERE q.handoff AND p_queue = ANY(q.queues)
                          AND p_name <> ALL(q.skip_names) AND q.until > now()
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
