-- The schema as the migrations leave it, in one file to read.
--
-- pgtasks/migrations/NNNN_slug.sql are what upgrades a database; this file is what they add up
-- to today, grouped by concept. Loaded into an empty schema it builds exactly what the
-- migrations build, version rows included (tests/integration/test_schema_snapshot.py compares
-- the two from the catalogs; `python -m pgtasks.sql.snapshot --check` does the same by hand).
-- A new migration changes this file in the same commit.
--
-- {schema} stands for the quoted schema name and {channel} for the literal name of its
-- notification channel (pgtasks_<schema>), as in the migrations; {{ and }} are braces.
--
-- Not here, because no migration creates them:
-- * what `pgtasks grants` gives each role: table privileges, EXECUTE on the functions below,
--   row-level security and its policies (see pgtasks.grants);
-- * the quota trigger (tasks_quota) and the index it counts with (tasks_source_pending_idx),
--   which exist only while some quota is set (see pgtasks.quotas and enforce_quotas below).

CREATE SCHEMA IF NOT EXISTS {schema};

-- The applied versions (created by pgtasks.migrate before the first migration runs). A schema
-- loaded from this file is at the newest version: `pgtasks migrate` has nothing left to do.
CREATE TABLE {schema}.migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.migrations (version, name) VALUES
    (1, 'initial'),
    (2, 'canvas'),
    (3, 'worker_tasks'),
    (4, 'rate_limits'),
    (5, 'schedule'),
    (6, 'ops_indexes'),
    (7, 'quotas'),
    (8, 'unique'),
    (9, 'effects'),
    (10, 'concurrency'),
    (11, 'quota_blocked'),
    (12, 'handoff'),
    (13, 'attempts_log'),
    (14, 'gated_wakeups'),
    (15, 'tasks_fillfactor'),
    (16, 'tasks_column_order'),
    (17, 'boundaries');


-- ============================================================================================
-- Tasks
-- ============================================================================================

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
REVOKE ALL ON FUNCTION {schema}.concurrency_key(jsonb) FROM PUBLIC;

-- One row per task instance (one enqueued call). The columns never changed after the enqueue
-- come first, then what a retry or a rate limit changes, then what every claim and every
-- outcome changes: an update whose new version stays on the old one's page is logged as the
-- new row less the bytes it shares with the old one at its start and end (migration 0016).
CREATE TABLE {schema}.tasks (
    id                   text        PRIMARY KEY,
    name                 text        NOT NULL,
    queue                text        NOT NULL DEFAULT 'celery',
    -- Higher first.
    priority             integer     NOT NULL DEFAULT 0,
    content_type         text        NOT NULL DEFAULT 'application/json',
    content_encoding     text        NOT NULL DEFAULT 'utf-8',
    -- json, not jsonb: the text is kept as written (jsonb's numeric turns 1e16 into an
    -- integer), and operators can still query it with -> and ->>. Payloads that are not JSON
    -- go to payload_raw.
    payload              json,
    payload_raw          bytea,
    headers              jsonb       NOT NULL DEFAULT '{{}}',
    max_retries          integer,
    expires_at           timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- Who enqueued the row: the session's pgtasks.source (an app's task_source setting), else
    -- its database role. Quotas and producers' rules count by it.
    source               text        NOT NULL
        DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''),
                         CURRENT_USER::text),
    -- Unique tasks: the key held while the task waits or runs, or with unique_until_started
    -- only until a worker first starts it (see tasks_unique_key_idx).
    unique_key           text,
    unique_until_started boolean     NOT NULL DEFAULT false,
    cancel_requested     boolean     NOT NULL DEFAULT false,
    -- The attempt at which an operator last requeued this dead-lettered task (0: never). The
    -- attempt itself never goes back (it is the fencing token), so lost-worker accounting
    -- counts only the claims after this one.
    requeued_attempt     integer     NOT NULL DEFAULT 0,
    -- When the row may run: eta, countdown, retry backoff, rate-limit start.
    run_at               timestamptz NOT NULL DEFAULT now(),
    retries              integer     NOT NULL DEFAULT 0,
    error                text,
    traceback            text,
    -- The fencing token: every claim adds one, and every fenced write carries it.
    attempt              integer     NOT NULL DEFAULT 0,
    -- BLOCKED: due, but held back by a concurrency limit.
    status               text        NOT NULL DEFAULT 'PENDING',
    claimed_by           text,
    lease_until          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- The check constraints keep the names PostgreSQL gave them in migration 0001.
    CONSTRAINT tasks_check CHECK (payload IS NOT NULL OR payload_raw IS NOT NULL),
    CONSTRAINT tasks_check1
        CHECK (status <> 'RUNNING' OR (claimed_by IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT tasks_status_check
        CHECK (status IN ('PENDING', 'BLOCKED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED',
                          'DEAD'))
)
-- Room on each page for a row's next two versions (its claim and its outcome), so that they
-- stay on its page (migration 0015).
WITH (fillfactor = 50);

-- Finished rows leave the claim path: every index of the claim, the lease and the outcome
-- paths is partial on status.

-- The claim reads this index only: due PENDING rows of a queue in claim order.
CREATE INDEX tasks_claim_idx ON {schema}.tasks (queue, priority DESC, run_at, created_at)
    WHERE status = 'PENDING';
-- Reclaiming finds expired leases here.
CREATE INDEX tasks_lease_idx ON {schema}.tasks (lease_until) WHERE status = 'RUNNING';
-- Retention prunes finished rows by age.
CREATE INDEX tasks_finished_idx ON {schema}.tasks (updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
-- Dead letters listed newest first, counted, and counted over a recent window.
CREATE INDEX tasks_dead_idx ON {schema}.tasks (updated_at) WHERE status = 'DEAD';
-- AsyncResult.children: the calls a task's completion enqueued (only rows that have a parent).
CREATE INDEX tasks_parent_idx ON {schema}.tasks ((headers ->> 'parent_id'))
    WHERE headers ? 'parent_id';
-- Blocked rows of a key in claim order: the next to move back to PENDING.
CREATE INDEX tasks_blocked_idx
    ON {schema}.tasks ((headers ->> 'concurrency_key'), priority DESC, run_at, created_at)
    WHERE status = 'BLOCKED';
-- Due rows under a limit, by key: when a claim finds a key full, it sets the key's other due
-- rows BLOCKED too, a batch at a time (rows without a limit are not in this index).
CREATE INDEX tasks_limited_idx ON {schema}.tasks ({schema}.concurrency_key(headers), run_at)
    WHERE status = 'PENDING' AND {schema}.concurrency_key(headers) IS NOT NULL;
-- Unique tasks. The partial unique index decides races between producers: at most one row per
-- key is ever in it. A row leaves it as it finishes (or, "until started", as it is first
-- claimed); a row going back to waiting (a retry, a release) never left it, and one that left
-- never comes back. A blocked row waits and has not started, so it still holds its key.
CREATE UNIQUE INDEX tasks_unique_key_idx ON {schema}.tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND CASE WHEN unique_until_started THEN status IN ('PENDING', 'BLOCKED') AND attempt = 0
               ELSE status IN ('PENDING', 'BLOCKED', 'RUNNING') END;

-- Wake idle workers when due rows arrive: one notification per statement and queue.
-- The payload is the queue name; identical notifications in one transaction collapse.
CREATE FUNCTION {schema}.notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], q.queue)
       FROM (SELECT DISTINCT queue FROM new_rows
              WHERE status = 'PENDING' AND run_at <= now()) AS q;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION {schema}.notify_due() FROM PUBLIC;

-- Statements that wake workers themselves (see wake) set pgtasks.gated for their transaction:
-- the trigger does not fire for them (a WHEN on the statement, so no function call either).
CREATE TRIGGER tasks_notify_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('pgtasks.gated', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {schema}.notify_due({channel});

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
REVOKE ALL ON FUNCTION {schema}.refuse_unclaimed_outcome() FROM PUBLIC;

CREATE TRIGGER tasks_outcome_needs_claim BEFORE UPDATE OF status ON {schema}.tasks
    FOR EACH ROW
    WHEN (OLD.status IN ('PENDING', 'BLOCKED') AND NEW.status IN ('COMPLETED', 'FAILED'))
    EXECUTE FUNCTION {schema}.refuse_unclaimed_outcome();

-- The attempt history, a log: one row for the end of every run, found by task. It has no
-- unique key: only the one fenced write that ends a run's ownership records it, and an
-- INSERT ... ON CONFLICT cost more than the key guarded (migration 0013).
CREATE TABLE {schema}.attempts (
    task_id     text        NOT NULL,
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    error       text
);
CREATE INDEX attempts_task_idx ON {schema}.attempts (task_id, attempt);
-- Throughput and per-minute outcome counts read a time window of the history.
CREATE INDEX attempts_finished_idx ON {schema}.attempts (finished_at);

-- Side effects a task has done, by name, so that a run after a crash or a lost lease skips
-- what an earlier run of the same task already committed (Task.effect).
CREATE TABLE {schema}.effects (
    task_id    text        NOT NULL,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, name)
);


-- ============================================================================================
-- Results
-- ============================================================================================

-- One row per task whose result is stored (Celery's result backend).
CREATE TABLE {schema}.results (
    task_id          text        PRIMARY KEY,
    state            text        NOT NULL,
    content_type     text        NOT NULL DEFAULT 'application/json',
    content_encoding text        NOT NULL DEFAULT 'utf-8',
    result           bytea,
    traceback        text,
    date_done        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX results_date_done_idx ON {schema}.results (date_done);

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
REVOKE ALL ON FUNCTION {schema}.notify_result() FROM PUBLIC;

CREATE TRIGGER results_notify_insert AFTER INSERT ON {schema}.results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_result();
CREATE TRIGGER results_notify_update AFTER UPDATE ON {schema}.results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_result();

-- GroupResult.save() / GroupResult.restore(). A saved group result is its saver's (a producer
-- reads and replaces only its own).
CREATE TABLE {schema}.group_results (
    id          text        PRIMARY KEY,
    result_ids  text[]      NOT NULL,
    date_done   timestamptz NOT NULL DEFAULT now(),
    source      text        NOT NULL
        DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''), CURRENT_USER::text)
);


-- ============================================================================================
-- Canvas
-- ============================================================================================

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
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- The body is enqueued by the worker whose member finishes last, under the rules of the
    -- role that created the chord.
    source      text        NOT NULL
        DEFAULT COALESCE(NULLIF(current_setting('pgtasks.source', true), ''), CURRENT_USER::text)
);


-- ============================================================================================
-- Workers, hand-off and wake-ups
-- ============================================================================================

-- One row per running worker: announced at start-up, its heartbeat kept fresh.
CREATE TABLE {schema}.workers (
    id           text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- The task names it has registered, for `pgtasks inspect registered`.
    tasks        text[]      NOT NULL DEFAULT '{{}}'
);

-- The workers that wait, one row each: taking hand-offs (handoff), or only woken by
-- notifications. A hand-off consumes the worker's row: a worker is handed at most one task per
-- park. A row is good until "until" (the database clock), and its worker parks again before
-- then while it stays idle. Unlogged: after a crash the table is empty and idle workers park
-- again at their next poll.
CREATE UNLOGGED TABLE {schema}.parked_workers (
    worker     text        PRIMARY KEY,
    -- The channel the worker listens on for the rows handed to it.
    channel    text        NOT NULL,
    queues     text[]      NOT NULL,
    -- Tasks the worker claims the usual way only (those with a rate limit there).
    skip_names text[]      NOT NULL DEFAULT '{{}}',
    lease      float8      NOT NULL CHECK (lease > 0),
    until      timestamptz NOT NULL,
    handoff    boolean     NOT NULL DEFAULT true
);

-- Take a parked worker of p_queue for a task the caller is inserting, and tell it the task's
-- id on its own channel; the worker claims that row in the database before it runs anything.
-- Returns the worker, or NULL when none is parked. A definer's function, so that producers
-- need no rights on parked_workers beyond reading it.
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
REVOKE ALL ON FUNCTION {schema}.hand_off(text, text, text) FROM PUBLIC;

-- The hand-off of producers of an older pgtasks (which wrote the row RUNNING for the worker),
-- kept while an upgrade rolls out: it hands off nothing, and their rows are written PENDING
-- and claimed as usual.
CREATE FUNCTION {schema}.hand_off(
    p_id text, p_name text, p_queue text, p_priority integer, p_max_retries integer,
    p_content_type text, p_content_encoding text, p_payload text, p_payload_raw bytea,
    p_headers jsonb, p_run_at timestamptz, p_expires_at timestamptz
) RETURNS {schema}.parked_workers LANGUAGE sql AS $$
    SELECT NULL::{schema}.parked_workers
$$;
REVOKE ALL ON FUNCTION {schema}.hand_off(
    text, text, text, integer, integer, text, text, text, bytea, jsonb, timestamptz, timestamptz)
    FROM PUBLIC;

-- Wake the workers of p_queue for a due row the caller is inserting, if one waits: under the
-- gate's lock (an advisory lock held shared until the caller commits; a park takes it
-- exclusive), a look at parked_workers with a snapshot taken after it. True when it notified.
-- Run with its owner's rights, as hand_off is.
CREATE FUNCTION {schema}.wake(p_queue text) RETURNS boolean
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
REVOKE ALL ON FUNCTION {schema}.wake(text) FROM PUBLIC;


-- ============================================================================================
-- Limits: rate limits, concurrency limits, quotas
-- ============================================================================================

-- Task rate limits shared by every worker: each key (a task name) hands out start times
-- ("slots") one interval apart; next_at is the first slot not yet given.
CREATE TABLE {schema}.rate_limits (
    key     text        PRIMARY KEY,
    next_at timestamptz NOT NULL
);

-- Global concurrency limits: at most max_running tasks RUNNING at once per key, across every
-- worker. running: this key's RUNNING rows. granted: how many rows the latest claim started
-- (read back by that claim only). A claim locks the key's row by its upsert, so claims of one
-- key decide one after the other on its latest count.
CREATE TABLE {schema}.concurrency_limits (
    key         text        PRIMARY KEY,
    max_running integer     NOT NULL CHECK (max_running > 0),
    running     integer     NOT NULL DEFAULT 0 CHECK (running >= 0),
    granted     integer     NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Quotas: a bound on how many waiting tasks one source may have (pgtasks quota).
CREATE TABLE {schema}.quotas (
    source      text        PRIMARY KEY,
    max_pending bigint      NOT NULL CHECK (max_pending >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Refuse an insert that leaves a source with more waiting tasks (PENDING or BLOCKED) than its
-- quota. The trigger that calls it (tasks_quota) and the index it counts with
-- (tasks_source_pending_idx) exist only while some quota is set, so that enqueueing pays
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
REVOKE ALL ON FUNCTION {schema}.enforce_quotas() FROM PUBLIC;


-- ============================================================================================
-- Unique keys held for a window of time
-- ============================================================================================

-- A key held for a window of time from the first enqueue, whatever happens to its task. An
-- enqueue locks the key's row (INSERT ... ON CONFLICT DO UPDATE), so concurrent producers
-- decide one after the other on the row's latest version. The pruner removes lapsed keys.
CREATE TABLE {schema}.unique_keys (
    key        text        PRIMARY KEY,
    task_id    text        NOT NULL,
    held_until timestamptz NOT NULL
);
CREATE INDEX unique_keys_held_until_idx ON {schema}.unique_keys (held_until);


-- ============================================================================================
-- Periodic tasks
-- ============================================================================================

-- Every scheduler (a worker with -B, or `pgtasks beat`) computes the same tick instants; a
-- tick is enqueued by whichever inserts its (entry, tick_at) row first, in the transaction
-- that inserts the task, so each tick runs once however many schedulers there are.
CREATE TABLE {schema}.schedule_entries (
    name       text        PRIMARY KEY,
    task       text        NOT NULL,
    schedule   text        NOT NULL,
    last_tick  timestamptz,
    next_tick  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.schedule_ticks (
    name        text        NOT NULL,
    tick_at     timestamptz NOT NULL,
    task_id     text        NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, tick_at)
);


-- ============================================================================================
-- Producers' rules
-- ============================================================================================

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
REVOKE ALL ON FUNCTION {schema}.may_enqueue(text, text, text, integer) FROM PUBLIC;
