-- Roles as a boundary, notifications as hints (DESIGN invariants 11 and 12).
--
-- A notification can be sent by any role that can connect, so nothing a worker does may rest
-- on one: a hand-off now names the task's id only, and the worker reads the row in the
-- database (RUNNING, its own) before it runs anything. Only the database can write a row
-- RUNNING for a worker at enqueue: a trigger that runs with its owner's rights, where a
-- producer's own rights cover the row's data and nothing else (see pgtasks.grants).

-- Direct hand-off, as a trigger on the row a single enqueue writes (insert_task_handoff sets
-- pgtasks.handoff for its transaction): a row that can start now (due, not expired, under no
-- concurrency limit) takes one parked worker of its queue that does not rate-limit its task,
-- and is written RUNNING for it (attempt 1, under its lease); the worker is told the row's
-- id on its own channel. With pgtasks.early, such a transaction commits without waiting for
-- the WAL flush (see insert_task_handoff). A due row not handed off wakes a waiting worker
-- (wake). The row's RUNNING state comes only from here: a producer may not write the
-- columns that say who runs a row.
CREATE FUNCTION {schema}.hand_off_row() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w {schema}.parked_workers;
BEGIN
    -- This row wakes workers itself (a hand-off, or wake; a row not due wakes nobody): not
    -- the statement's trigger too.
    PERFORM set_config('pgtasks.gated', 'on', true);
    IF NEW.status <> 'PENDING' OR NEW.run_at > now() THEN
        RETURN NEW;
    END IF;
    IF (NEW.expires_at IS NULL OR NEW.expires_at > now())
       AND {schema}.concurrency_key(NEW.headers) IS NULL
       AND EXISTS (SELECT 1 FROM {schema}.parked_workers WHERE handoff AND until > now()) THEN
        DELETE FROM {schema}.parked_workers AS p
         WHERE p.worker = (SELECT q.worker FROM {schema}.parked_workers AS q
                            WHERE q.handoff AND NEW.queue = ANY(q.queues)
                              AND NEW.name <> ALL(q.skip_names) AND q.until > now()
                            LIMIT 1
                              FOR UPDATE SKIP LOCKED)
        RETURNING p.* INTO w;
    END IF;
    IF w.worker IS NULL THEN
        PERFORM {schema}.wake(NEW.queue);
        RETURN NEW;
    END IF;
    NEW.status := 'RUNNING';
    NEW.attempt := 1;
    NEW.claimed_by := w.worker;
    NEW.lease_until := now() + make_interval(secs => w.lease);
    IF current_setting('pgtasks.early', true) = 'on' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_notify(w.channel, json_build_array(NEW.id)::text);
    RETURN NEW;
END
$$;
CREATE TRIGGER tasks_hand_off BEFORE INSERT ON {schema}.tasks
    FOR EACH ROW WHEN (current_setting('pgtasks.handoff', true) = 'on')
    EXECUTE FUNCTION {schema}.hand_off_row();

-- The hand_off of older versions: their producers, still running while an upgrade rolls out,
-- call it (it wrote the row RUNNING for the worker and sent the row whole). It now hands off
-- nothing, and their rows are written PENDING and claimed as usual.
DROP FUNCTION {schema}.hand_off(
    text, text, text, integer, integer, text, text, text, bytea, jsonb, timestamptz, timestamptz);
CREATE FUNCTION {schema}.hand_off(
    p_id text, p_name text, p_queue text, p_priority integer, p_max_retries integer,
    p_content_type text, p_content_encoding text, p_payload text, p_payload_raw bytea,
    p_headers jsonb, p_run_at timestamptz, p_expires_at timestamptz
) RETURNS {schema}.parked_workers LANGUAGE sql AS $$
    SELECT NULL::{schema}.parked_workers
$$;

-- wake() as before, run with its owner's rights for the same reason.
CREATE OR REPLACE FUNCTION {schema}.wake(p_queue text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- What each producer role may enqueue (written by pgtasks grants beside its row policies):
-- NULL allows any queue or name; a name ending in ".*" allows that prefix. A task a worker
-- enqueues because of another (a link, an errback, the next step of a chain, a chord's body)
-- carries the source of the row or chord it follows, and is held to that source's rules: a
-- producer gets nothing through a follow-up that it could not enqueue itself.
CREATE TABLE {schema}.producer_rules (
    role         text        PRIMARY KEY,
    queues       text[],
    names        text[],
    max_priority integer     NOT NULL DEFAULT 255,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Whether a row of p_source may be p_name in p_queue at p_priority; true for a source
-- without rules (a worker's own enqueues, the schema owner's, rows from before roles).
CREATE FUNCTION {schema}.may_enqueue(p_source text, p_name text, p_queue text,
                                     p_priority integer) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT COALESCE(
        (SELECT (r.queues IS NULL OR p_queue = ANY(r.queues))
                AND (r.names IS NULL
                     OR EXISTS (SELECT 1 FROM unnest(r.names) AS n(pattern)
                                 WHERE CASE WHEN right(n.pattern, 2) = '.*'
                                            THEN starts_with(p_name, left(n.pattern, -1))
                                            ELSE p_name = n.pattern END))
                AND p_priority BETWEEN 0 AND r.max_priority
           FROM {schema}.producer_rules AS r
          WHERE r.role = p_source),
        true)
$$;

-- A chord's body is enqueued by the worker whose member finishes last: under the rules of
-- the role that created the chord.
ALTER TABLE {schema}.chords ADD COLUMN source text NOT NULL
    DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''), CURRENT_USER::text);

-- A saved group result is its saver's (a producer reads and replaces only its own).
ALTER TABLE {schema}.group_results ADD COLUMN source text NOT NULL
    DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''), CURRENT_USER::text);

-- A waiting row ends only by being claimed first (or revoked, or dead-lettered): an outcome
-- written over a row nobody ran would let a role that may finish and prune tasks make a
-- waiting one disappear. The schema's owner (and a superuser) may still set any status, to
-- mend rows by hand.
CREATE FUNCTION {schema}.refuse_unclaimed_outcome() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID),
                   'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'task % is %: only a claimed (RUNNING) task can become %',
            OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              HINT = 'claim the task first, or revoke it to cancel it';
END
$$;
CREATE TRIGGER tasks_outcome_needs_claim BEFORE UPDATE OF status ON {schema}.tasks
    FOR EACH ROW
    WHEN (OLD.status IN ('PENDING', 'BLOCKED') AND NEW.status IN ('COMPLETED', 'FAILED'))
    EXECUTE FUNCTION {schema}.refuse_unclaimed_outcome();

-- No function of the schema is anyone's to call but its owner's, unless pgtasks grants gives
-- it to a role (PostgreSQL grants EXECUTE to PUBLIC by default).
REVOKE ALL ON FUNCTION {schema}.notify_due() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.notify_result() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.enforce_quotas() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.concurrency_key(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.hand_off_row() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.hand_off(
    text, text, text, integer, integer, text, text, text, bytea, jsonb, timestamptz, timestamptz)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.wake(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.may_enqueue(text, text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.refuse_unclaimed_outcome() FROM PUBLIC;

-- Roles given their rights before this version keep enqueueing and working until pgtasks
-- grants runs again: a role that may insert tasks may call what an enqueue calls (the task
-- table's index reads concurrency_key), and a role that may update them, what a worker calls.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole::text AS role, a.privilege_type AS right_
               FROM pg_class AS c, aclexplode(c.relacl) AS a
              WHERE c.oid = '{schema}.tasks'::regclass AND a.grantee <> 0
                AND a.grantee <> c.relowner AND a.privilege_type IN ('INSERT', 'UPDATE')
    LOOP
        IF r.right_ = 'INSERT' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.concurrency_key(jsonb),'
                           ' {schema}.wake(text) TO %s', r.role);
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.may_enqueue(text, text, text,'
                           ' integer) TO %s', r.role);
            EXECUTE format('GRANT SELECT ON {schema}.producer_rules TO %s', r.role);
        END IF;
    END LOOP;
END
$$;
