-- Roles as a boundary, notifications as hints (DESIGN invariants 11 and 12).
--
-- A notification can be sent by any role that can connect, so nothing a worker does may rest
-- on one: a hand-off now names the task's id only, and the worker claims that row in the
-- database (as any claim does: due, PENDING, one of its queues) before it runs anything. An
-- enqueue no longer writes RUNNING rows for a worker: the producer's row is PENDING like any
-- other, and its rights can be pinned to exactly that (see pgtasks.grants).

-- Take a parked worker of p_queue for a task the caller is inserting, and tell it the task's
-- id on its own channel. Returns the worker, or NULL when none is parked. A definer's
-- function, so that producers need no rights on parked_workers beyond reading it; calling it
-- without inserting the row costs a park and makes a worker look for a row it will not find.
--
-- Producers of an older pgtasks, still running while an upgrade rolls out, call the old
-- hand_off (which wrote the row RUNNING for the worker and sent it whole): it now hands off
-- nothing, and their rows are written PENDING and claimed as usual.
CREATE OR REPLACE FUNCTION {schema}.hand_off(
    p_id text, p_name text, p_queue text, p_priority integer, p_max_retries integer,
    p_content_type text, p_content_encoding text, p_payload text, p_payload_raw bytea,
    p_headers jsonb, p_run_at timestamptz, p_expires_at timestamptz
) RETURNS {schema}.parked_workers LANGUAGE sql AS $$
    SELECT NULL::{schema}.parked_workers
$$;
CREATE FUNCTION {schema}.hand_off(p_id text, p_name text, p_queue text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w {schema}.parked_workers;
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
    PERFORM pg_notify(w.channel, json_build_array(p_id)::text);
    RETURN w.worker;
END
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
REVOKE ALL ON FUNCTION {schema}.hand_off(text, text, text) FROM PUBLIC;
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
                           ' {schema}.hand_off(text, text, text), {schema}.wake(text) TO %s',
                           r.role);
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.may_enqueue(text, text, text,'
                           ' integer) TO %s', r.role);
            EXECUTE format('GRANT SELECT ON {schema}.producer_rules TO %s', r.role);
        END IF;
    END LOOP;
END
$$;
