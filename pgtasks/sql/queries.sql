-- Every query pgtasks runs at run time, by name. Loaded once by pgtasks.sql; executed only by
-- pgtasks.broker. {schema} is replaced by the quoted schema identifier, never by string pasting
-- of user input. Parameters are psycopg named placeholders.

-- name: insert_task
-- Enqueue one task; relative times (countdown, expires in seconds) use the database clock.
INSERT INTO {schema}.tasks
    (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
     payload, payload_raw, headers, max_retries)
VALUES
    (%(id)s, %(name)s, %(queue)s, %(priority)s,
     COALESCE(%(eta)s::timestamptz, now() + make_interval(secs => COALESCE(%(countdown)s::float8, 0))),
     COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
     %(content_type)s, %(content_encoding)s, %(payload)s::json, %(payload_raw)s::bytea,
     %(headers)s::jsonb, %(max_retries)s)

-- name: insert_task_handoff
-- insert_task outside a caller's transaction: a task that can start now (due, not expired,
-- not rate-limited there) is handed to a parked worker of its queue (see parked_workers and
-- hand_off): the worker is told the row's id and claims that row at once, without waiting
-- for its next poll or sharing the wake-up with every waiting worker. The row itself is
-- PENDING like any other: the notification only tells the worker where to look. No worker
-- parked: the row is written as ever, at the cost of one look at an empty table. A row not
-- handed off wakes a waiting worker itself (wake, which notifies only while one waits), and
-- "gated" keeps the trigger tasks_notify_insert off.
-- Where %(early)s, a handed-off row commits without waiting for the WAL flush ("early"), so
-- that its NOTIFY leaves, and the task starts, while the disk is still writing; the caller
-- then runs flush_commit before it returns (handed_off says when), and the row is on disk by
-- then all the same. A crash of the server in between can take back a row whose task has
-- started: the caller's enqueue fails, and the worker's fenced write finds no row.
WITH o AS (
    SELECT h.w, h.run_at, h.expires_at,
           CASE WHEN h.w IS NULL AND h.run_at <= now()
                THEN {schema}.wake(%(queue)s::text) END AS woke,
           set_config('pgtasks.gated', 'on', true) AS gated,
           CASE WHEN %(early)s::bool AND h.w IS NOT NULL
                THEN set_config('synchronous_commit', 'off', true) END AS early
      FROM (
        SELECT CASE WHEN v.run_at <= now() AND (v.expires_at IS NULL OR v.expires_at > now())
                     AND EXISTS (SELECT 1 FROM {schema}.parked_workers
                                  WHERE handoff AND until > now())
                    THEN {schema}.hand_off(%(id)s::text, %(name)s::text, %(queue)s::text)
               END AS w,
               v.run_at, v.expires_at
          FROM (SELECT COALESCE(%(eta)s::timestamptz,
                                now() + make_interval(secs => COALESCE(%(countdown)s::float8, 0)))
                         AS run_at,
                       COALESCE(%(expires_at)s::timestamptz,
                                now() + make_interval(secs => %(expires_in)s::float8))
                         AS expires_at) AS v
        OFFSET 0) AS h
), ins AS (
    INSERT INTO {schema}.tasks
        (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
         payload, payload_raw, headers, max_retries)
    SELECT %(id)s, %(name)s, %(queue)s, %(priority)s, o.run_at, o.expires_at,
           %(content_type)s, %(content_encoding)s, %(payload)s::json, %(payload_raw)s::bytea,
           %(headers)s::jsonb, %(max_retries)s
      FROM o
    RETURNING 1
)
SELECT o.w IS NOT NULL AS handed_off FROM o, ins

-- name: flush_commit
-- Returns once the WAL written before it is on disk (and, under synchronous replication, on
-- the standbys the session's synchronous_commit waits for). A transaction that writes no WAL
-- commits without waiting for the flush, so this one writes the smallest record there is: an
-- empty transactional message (seen only by logical decoding clients that ask for messages,
-- under the prefix "pgtasks"), and its commit waits for the flush up to it.
SELECT pg_logical_emit_message(true, 'pgtasks', ''::text) IS NOT NULL AS flushed

-- name: early_commit_allowed
-- Whether this role may run flush_commit (EXECUTE on pg_logical_emit_message is granted to
-- PUBLIC unless an administrator revoked it): without it, hand-offs wait for the flush. By
-- its oid: PostgreSQL 17 added a fourth argument (flush, false by default).
SELECT EXISTS (
    SELECT 1
      FROM pg_catalog.pg_proc
     WHERE proname = 'pg_logical_emit_message'
       AND pronamespace = 'pg_catalog'::regnamespace
       AND proargtypes[2] = 'text'::regtype
       AND has_function_privilege(oid, 'EXECUTE')
) AS allowed

-- name: record_effect
-- Record that the task did the named effect, in the caller's transaction (or at once outside
-- one); a row back means this is the first time. A concurrent run recording the same effect
-- waits here until the first one's transaction ends, then finds it recorded (or, had that one
-- rolled back, records it itself).
INSERT INTO {schema}.effects (task_id, name) VALUES (%(task_id)s, %(name)s)
ON CONFLICT DO NOTHING
RETURNING true AS recorded

-- name: effect_recorded
SELECT EXISTS (SELECT 1 FROM {schema}.effects
                WHERE task_id = %(task_id)s AND name = %(name)s) AS recorded

-- name: insert_task_unique
-- Enqueue one task unless the row of another holds its unique key (see tasks_unique_key_idx):
-- then insert nothing and return that task's id. The index
-- tasks_unique_key_idx settles races between producers. A holder that committed after this
-- statement's snapshot is not visible to the second half: no row comes back, and the caller
-- runs the statement again (a new snapshot in READ COMMITTED).
WITH ins AS (
    INSERT INTO {schema}.tasks
        (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
         payload, payload_raw, headers, max_retries, unique_key, unique_until_started)
    VALUES
        (%(id)s, %(name)s, %(queue)s, %(priority)s,
         COALESCE(%(eta)s::timestamptz, now() + make_interval(secs => COALESCE(%(countdown)s::float8, 0))),
         COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
         %(content_type)s, %(content_encoding)s, %(payload)s::json, %(payload_raw)s::bytea,
         %(headers)s::jsonb, %(max_retries)s, %(unique_key)s, %(until_started)s)
    ON CONFLICT (unique_key)
       WHERE unique_key IS NOT NULL
         AND CASE WHEN unique_until_started THEN status IN ('PENDING', 'BLOCKED') AND attempt = 0
                  ELSE status IN ('PENDING', 'BLOCKED', 'RUNNING') END
    DO NOTHING
    RETURNING id
)
SELECT id, true AS inserted FROM ins
UNION ALL
SELECT t.id, false
  FROM {schema}.tasks AS t
 WHERE NOT EXISTS (SELECT 1 FROM ins)
   AND t.unique_key = %(unique_key)s
   AND CASE WHEN t.unique_until_started THEN t.status IN ('PENDING', 'BLOCKED') AND t.attempt = 0
            ELSE t.status IN ('PENDING', 'BLOCKED', 'RUNNING') END

-- name: insert_task_unique_window
-- Enqueue one task unless its key was taken less than its window ago: then insert nothing and
-- return the id of the task that took it. The key's row is locked by the upsert, so producers
-- racing on one key decide one after the other, each on the row's latest version.
WITH k AS (
    INSERT INTO {schema}.unique_keys AS u (key, task_id, held_until)
    VALUES (%(unique_key)s, %(id)s, now() + make_interval(secs => %(window)s::float8))
    ON CONFLICT (key) DO UPDATE
       SET task_id = CASE WHEN u.held_until > now() THEN u.task_id ELSE excluded.task_id END,
           held_until = CASE WHEN u.held_until > now() THEN u.held_until
                             ELSE excluded.held_until END
    RETURNING u.task_id
), ins AS (
    INSERT INTO {schema}.tasks
        (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
         payload, payload_raw, headers, max_retries, unique_key)
    SELECT %(id)s, %(name)s, %(queue)s, %(priority)s,
           COALESCE(%(eta)s::timestamptz, now() + make_interval(secs => COALESCE(%(countdown)s::float8, 0))),
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(content_type)s, %(content_encoding)s, %(payload)s::json, %(payload_raw)s::bytea,
           %(headers)s::jsonb, %(max_retries)s, NULL
      FROM k
     WHERE k.task_id = %(id)s
    RETURNING id
)
SELECT k.task_id AS id, k.task_id = %(id)s AS inserted FROM k

-- name: insert_tasks
-- Enqueue many tasks in one statement (group, apply_many): the rows travel as one json array
-- of objects, which the client writes and the server reads far faster than one array per
-- column. payload is the json text as written, payload_raw base64.
INSERT INTO {schema}.tasks
    (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
     payload, payload_raw, headers, max_retries)
SELECT i.id, i.name, i.queue, i.priority,
       COALESCE(i.eta, now() + make_interval(secs => COALESCE(i.countdown, 0))),
       COALESCE(i.expires_at, now() + make_interval(secs => i.expires_in)),
       i.content_type, i.content_encoding, i.payload::json, decode(i.payload_raw, 'base64'),
       i.headers, i.max_retries
  FROM json_to_recordset(%(rows)s::json)
    AS i(id text, name text, queue text, priority int, eta timestamptz, countdown float8,
         expires_at timestamptz, expires_in float8, content_type text, content_encoding text,
         payload text, payload_raw text, headers jsonb, max_retries int)

-- name: insert_followups
-- Enqueue the tasks outcomes trigger (links, errbacks, a chain's next step, a chord's body):
-- insert_tasks' rows, each with the source of the row or chord it follows (NULL: the worker's
-- own). The worker writes them, but under that source's rules (see producer_rules): a task its
-- producer could not have enqueued itself is written dead-lettered, never to run, with the
-- reason, and the rest are written as usual.
INSERT INTO {schema}.tasks
    (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
     payload, payload_raw, headers, max_retries, source, status, error)
SELECT i.id, i.name, i.queue, i.priority,
       COALESCE(i.eta, now() + make_interval(secs => COALESCE(i.countdown, 0))),
       COALESCE(i.expires_at, now() + make_interval(secs => i.expires_in)),
       i.content_type, i.content_encoding, i.payload::json, decode(i.payload_raw, 'base64'),
       i.headers, i.max_retries, w.source,
       CASE WHEN w.allowed THEN 'PENDING' ELSE 'DEAD' END,
       CASE WHEN NOT w.allowed
            THEN format('NotPermitted: %%s may not enqueue %%s to queue %%s with priority %%s'
                        ' (this task follows one of its tasks)',
                        w.source, i.name, i.queue, i.priority) END
  FROM json_to_recordset(%(rows)s::json)
    AS i(id text, name text, queue text, priority int, eta timestamptz, countdown float8,
         expires_at timestamptz, expires_in float8, content_type text, content_encoding text,
         payload text, payload_raw text, headers jsonb, max_retries int, source text)
 CROSS JOIN LATERAL (
        SELECT f.source, {schema}.may_enqueue(f.source, i.name, i.queue, i.priority) AS allowed
          FROM (SELECT COALESCE(i.source, NULLIF(current_setting('pgtasks.source', true), ''),
                                current_user::text) AS source) AS f
       ) AS w
RETURNING id, name, status, source

-- name: claim_batch
-- Claim up to %(limit)s due PENDING rows of the given queues in priority order, in one statement:
-- lock with SKIP LOCKED, mark RUNNING under this worker's lease, bump the attempt (the fencing token).
-- It reads up to %(scan)s (at least %(limit)s) rows to find them (see "picked").
-- The RETURNING columns are in the order of pgtasks.message.ClaimedTask's fields (built positionally).
-- One ordered index scan per queue (a plain "queue = ANY(...)" would sort every pending row).
-- Rows under a concurrency limit start only while their key has room (see "counted"); the
-- others are set BLOCKED. Rows of a rate-limited task start only at their start time (see
-- "rated"); the later ones stay PENDING, due then. Both come back with set_aside, their status
-- (the caller counts them as taken and drops them).
-- insert: claim_due
-- insert: claim_limited

-- name: claim_plain
-- claim_batch for a worker with no rate-limited task, while its queues hold no row under a
-- concurrency limit: the same rows in the same order, locked the same way, set RUNNING the same
-- way, without the parts that decide limits. Those cost the server about a quarter of a claim
-- when no row is limited. Should a row under a concurrency limit be among the rows it picked,
-- it starts none of them and returns one row whose set_aside is 'LIMITED' (its other columns
-- NULL): the caller then claims with claim_batch, which decides that row's limit. The caller
-- passes its limit as %(scan)s: the plain claim reads no further than it starts.
-- insert: claim_due
-- insert: claim_unlimited

-- name: claim_handed_plain
-- claim_handed as claim_plain claims: the rows a hand-off named that are PENDING, due and of
-- this worker's queues, unless their task is rate-limited on this worker (those are left for
-- the worker's usual claims, which decide rate limits; a producer never hands them off, so only
-- a forged notification names them) or one of them is under a concurrency limit ('LIMITED':
-- the caller then claims with claim_handed).
WITH due AS (
-- insert: due_columns
      -- One primary-key lookup a named id (a plan of its own would read the queue's index).
      FROM unnest(%(ids)s::text[]) AS h(id)
     CROSS JOIN LATERAL (
-- insert: due_row
               AND id = h.id
               AND queue = ANY(%(queues)s::text[])
               AND name <> ALL(%(rate_names)s::text[])
               AND run_at <= now()
               FOR UPDATE SKIP LOCKED
           ) AS c
-- insert: claim_unlimited

-- name: claim_handed
-- claim_batch for the rows a hand-off named (see insert_task_handoff): the same checks as any
-- claim (PENDING, due, one of this worker's queues, limits decided), so that a notification,
-- which any role that can connect may send, never makes a worker run what the table does not
-- say it may. A row another worker claimed first is simply not found.
WITH due AS (
-- insert: due_columns
      -- One primary-key lookup a named id (a plan of its own would read the queue's index).
      FROM unnest(%(ids)s::text[]) AS h(id)
     CROSS JOIN LATERAL (
-- insert: due_row
               AND id = h.id
               AND queue = ANY(%(queues)s::text[])
               AND run_at <= now()
               FOR UPDATE SKIP LOCKED
           ) AS c
-- insert: claim_limited

-- name: claim_batch_from_floors
-- claim_batch for a worker whose full claims have become slow (see pgtasks.worker.floors): the
-- known (queue, priority) bands are read from their floors on, the priority ranges between them
-- in full. Same locking, concurrency limits, update and RETURNING columns as claim_batch.
WITH due AS (
-- insert: due_columns
      FROM unnest(%(band_queues)s::text[], %(band_priorities)s::int[],
                  %(band_floors)s::timestamptz[]) AS b(queue, priority, floor)
     CROSS JOIN LATERAL (
            -- Equal queue and priority: the floor bounds the index search itself, so entries
            -- behind it are never visited.
-- insert: due_row
               AND queue = b.queue
               AND priority = b.priority
               AND run_at >= b.floor
               AND run_at <= now()
             ORDER BY run_at, created_at
             LIMIT %(scan)s
               FOR UPDATE SKIP LOCKED
           ) AS c
    UNION ALL
-- insert: due_columns
      FROM unnest(%(gap_queues)s::text[], %(gap_lows)s::int[], %(gap_highs)s::int[])
           AS g(queue, low, high)
     CROSS JOIN LATERAL (
-- insert: due_row
               AND queue = g.queue
               AND priority BETWEEN g.low AND g.high
               AND run_at <= now()
             ORDER BY priority DESC, run_at, created_at
             LIMIT %(scan)s
               FOR UPDATE SKIP LOCKED
           ) AS c
     ORDER BY priority DESC, run_at, created_at
     LIMIT %(scan)s
-- insert: claim_limited

-- name: rows_behind_floors
-- For each known (queue, priority) band, the earliest due PENDING row behind its floor, which
-- claims from floors do not see (see pgtasks.worker.floors). A read: it takes no locks.
SELECT b.queue, b.priority, behind.run_at
  FROM unnest(%(band_queues)s::text[], %(band_priorities)s::int[],
              %(band_floors)s::timestamptz[]) AS b(queue, priority, floor)
 CROSS JOIN LATERAL (
        SELECT run_at
          FROM {schema}.tasks
         WHERE status = 'PENDING'
           AND queue = b.queue
           AND priority = b.priority
           AND run_at < b.floor
           AND run_at <= now()
         ORDER BY run_at
         LIMIT 1
       ) AS behind

-- name: renew_leases
-- Extend the lease of every task this worker still owns; a row missing from the result was lost.
-- cancel_requested tells the worker that a running task was revoked.
WITH owned AS (
    -- A renewal never waits for a row lock (SKIP LOCKED), so no other write of this worker
    -- can deadlock with it: its outcome writes, which lock their rows in no set order, wait
    -- for a renewal at most. "id = ANY" keeps the lookup on the primary key: the planner
    -- cannot see how many rows unnest() yields and would otherwise walk every RUNNING row.
    SELECT t.id
      FROM {schema}.tasks AS t
     WHERE t.id = ANY(%(ids)s::text[]) AND t.claimed_by = %(worker)s
     ORDER BY t.id
       FOR UPDATE OF t SKIP LOCKED
), renewed AS (
    UPDATE {schema}.tasks AS t
       SET lease_until = now() + make_interval(secs => %(lease)s::float8)
      FROM unnest(%(ids)s::text[], %(attempts)s::int[]) AS i(id, attempt)
     -- The row is looked up by its primary key. Written "(...) IS TRUE", the status check is
     -- not the lease index's predicate, which would let the planner scan that whole partial
     -- index for each row (it holds an entry for every lease a row has had until vacuum
     -- removes it: small in its statistics, millions beside a long-open transaction). Every
     -- fenced write does this.
     WHERE t.id = ANY(ARRAY(SELECT id FROM owned)) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE
    RETURNING t.id, t.cancel_requested
)
SELECT id, cancel_requested FROM renewed
UNION ALL
-- The rows skipped because another transaction held them (most often this worker's own write
-- of their outcome) that were still this run's as the statement began: not renewed this time,
-- and not lost. Should the other transaction have taken them away, the next renewal says so.
SELECT t.id, false
  FROM {schema}.tasks AS t
  JOIN unnest(%(ids)s::text[], %(attempts)s::int[]) AS i(id, attempt) ON i.id = t.id
 WHERE t.id = ANY(%(ids)s::text[]) AND t.id <> ALL(ARRAY(SELECT id FROM owned))
   AND t.attempt = i.attempt AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE

-- name: complete_batch
-- Fenced success for many tasks: COMPLETED (CANCELLED when a revoke arrived while it ran),
-- result row where results are kept (state SUCCESS, or IGNORED for a task that raised Ignore),
-- attempt history. Returns the rows this worker still owned.
-- insert: completion_done
-- insert: completion_results
-- insert: completion_history

-- name: complete_batch_unstored
-- complete_batch for a batch in which no outcome keeps a result: without the results part,
-- whose statement triggers fire even when it writes no row.
-- insert: completion_done
-- insert: completion_history

-- name: complete_batch_drop
-- complete_batch for workers that keep no finished rows (finished_task_retention = 0): a
-- success deletes its row in the completing statement, with what the pruner would delete with
-- it (attempt history, effects), instead of updating it to COMPLETED and deleting it later. A
-- row whose revoke arrived while it ran is kept, as CANCELLED, like a failure.
-- insert: completion_drop
-- insert: completion_results
-- insert: completion_drop_history

-- name: complete_batch_drop_unstored
-- complete_batch_drop for a batch in which no outcome keeps a result.
-- insert: completion_drop
-- insert: completion_drop_history

-- name: fail_batch
-- Fenced terminal failure: FAILED (a non-retried error) or DEAD (retry budget spent, worker lost,
-- undecodable payload), keeping payload, error and traceback. A revoke that arrived wins.
-- The update locks its rows in no set order, as a completion does (see completion_input).
WITH input AS (
    SELECT *
      FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(statuses)s::text[], %(errors)s::text[],
                  %(tracebacks)s::text[], %(store)s::bool[], %(content_types)s::text[],
                  %(results)s::bytea[], %(started_ago)s::float8[])
        AS i(id, attempt, status, error, traceback, store, content_type, result, started_ago)
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE i.status END,
           error = CASE WHEN t.cancel_requested
                        THEN 'revoked while running'
                             || COALESCE(' by ' || (t.headers ->> 'revoked_by'), '')
                             || COALESCE('; ' || i.error, '')
                        ELSE i.error END,
           traceback = i.traceback,
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM input AS i
     WHERE t.id = ANY(%(ids)s::text[]) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE  -- see renew_leases
    RETURNING t.id, t.attempt, t.status, t.error, {schema}.concurrency_key(t.headers) AS limit_key,
              t.source
), saved AS (
    INSERT INTO {schema}.results AS r (task_id, state, content_type, result, traceback, date_done)
    SELECT d.id, CASE d.status WHEN 'CANCELLED' THEN 'REVOKED' ELSE 'FAILURE' END,
           i.content_type, i.result, i.traceback, now()
      FROM done AS d JOIN input AS i USING (id)
     WHERE i.store
    ON CONFLICT (task_id) DO UPDATE
       SET state = EXCLUDED.state, content_type = EXCLUDED.content_type,
           result = EXCLUDED.result, traceback = EXCLUDED.traceback, date_done = EXCLUDED.date_done
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, started_at, outcome, error)
    SELECT d.id, d.attempt, %(worker)s, now() - make_interval(secs => i.started_ago),
           lower(d.status), d.error
      FROM done AS d JOIN input AS i USING (id)
-- insert: give_counts_back
)
SELECT id, status, limit_key, source FROM done

-- name: retry_batch
-- Fenced retry: back to PENDING at the given time (eta, or now() + delay on the database clock),
-- with the retry count written in the same statement. A revoke that arrived wins (CANCELLED).
-- Where results are kept, the exception is stored as the RETRY state's info, as in Celery.
-- The update locks its rows in no set order, as a completion does (see completion_input).
WITH input AS (
    SELECT *
      FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(retries)s::int[], %(delays)s::float8[],
                  %(etas)s::timestamptz[], %(errors)s::text[], %(tracebacks)s::text[],
                  %(outcomes)s::text[], %(started_ago)s::float8[], %(content_types)s::text[],
                  %(results)s::bytea[])
        AS i(id, attempt, retries, delay, eta, error, traceback, outcome, started_ago,
             content_type, result)
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           retries = i.retries,
           run_at = COALESCE(i.eta, now() + make_interval(secs => i.delay)),
           headers = t.headers - 'rate_slot',
           error = i.error, traceback = i.traceback,
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM input AS i
     WHERE t.id = ANY(%(ids)s::text[]) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE  -- see renew_leases
    RETURNING t.id, t.attempt, t.status, t.run_at, {schema}.concurrency_key(t.headers) AS limit_key
), saved AS (
    INSERT INTO {schema}.results AS r (task_id, state, content_type, result, traceback, date_done)
    SELECT d.id, 'RETRY', i.content_type, i.result, i.traceback, now()
      FROM done AS d JOIN input AS i USING (id)
     WHERE i.result IS NOT NULL AND d.status = 'PENDING'
    ON CONFLICT (task_id) DO UPDATE
       SET state = EXCLUDED.state, content_type = EXCLUDED.content_type,
           result = EXCLUDED.result, traceback = EXCLUDED.traceback, date_done = now()
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, started_at, outcome, error)
    SELECT d.id, d.attempt, %(worker)s, now() - make_interval(secs => i.started_ago),
           i.outcome, i.error
      FROM done AS d JOIN input AS i USING (id)
     WHERE i.outcome IS NOT NULL
-- insert: give_counts_back
)
SELECT id, status, limit_key, run_at FROM done

-- name: release_batch
-- Fenced hand-back of claimed rows that never started (shutdown, unknown task name): PENDING
-- again after the given delay, the claim's attempt given back, and a concurrency limit's
-- count. A revoke that arrived wins. The update locks its rows in no set order, as a completion
-- does (see completion_input).
WITH input AS (
    SELECT *
      FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(delays)s::float8[], %(errors)s::text[])
        AS i(id, attempt, delay, error)
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           attempt = t.attempt - 1,
           -- A key held only until started was let go at the claim: another task may hold it.
           unique_key = CASE WHEN t.unique_until_started THEN NULL ELSE t.unique_key END,
           run_at = now() + make_interval(secs => i.delay),
           error = COALESCE(i.error, t.error),
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM input AS i
     WHERE t.id = ANY(%(ids)s::text[]) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE  -- see renew_leases
    RETURNING t.id, t.status, {schema}.concurrency_key(t.headers) AS limit_key
-- insert: give_counts_back
)
SELECT id, status, limit_key FROM done

-- name: unblock
-- Concurrency limits: move BLOCKED rows of the given keys back to PENDING, as many per key as
-- it has room (one for a key without a count yet), in claim order, and wake the workers of
-- their queues. Run after a statement gave a key's count back, in a statement of its own: its
-- snapshot then sees every row a claim blocked before that (a claim of the key held the key's
-- row until it committed). A row moved back does not hold a place: a claim decides again.
WITH room AS (
    SELECT k.key, COALESCE(l.max_running - l.running, 1) AS free
      FROM unnest(%(keys)s::text[]) AS k(key)
      LEFT JOIN {schema}.concurrency_limits AS l ON l.key = k.key
), picked AS (
    SELECT b.id
      FROM room
     CROSS JOIN LATERAL (
            SELECT id
              FROM {schema}.tasks
             WHERE status = 'BLOCKED' AND headers ->> 'concurrency_key' = room.key
             ORDER BY priority DESC, run_at, created_at
             LIMIT GREATEST(room.free, 0)
               FOR UPDATE SKIP LOCKED
           ) AS b
), moved AS (
    UPDATE {schema}.tasks AS t
       SET status = 'PENDING', updated_at = now()
      FROM picked
     WHERE t.id = picked.id AND t.status = 'BLOCKED'
    RETURNING t.queue, t.run_at
)
SELECT count(*)::int AS n,
       (SELECT count(pg_notify(%(channel)s, q.queue))
          FROM (SELECT DISTINCT queue FROM moved WHERE run_at <= now()) AS q) AS notified
  FROM moved

-- name: blocked_keys
-- Keys with BLOCKED rows and room to start one (their count below their limit, or no count),
-- up to %(limit)s from %(after)s on in key order: the rows a lost unblock left behind (a worker
-- killed between giving a count back and moving its key's rows), or a limit raised since.
WITH RECURSIVE keys AS (
    (SELECT headers ->> 'concurrency_key' AS key
       FROM {schema}.tasks
      WHERE status = 'BLOCKED' AND headers ->> 'concurrency_key' > %(after)s
      ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT headers ->> 'concurrency_key'
              FROM {schema}.tasks
             WHERE status = 'BLOCKED' AND headers ->> 'concurrency_key' > keys.key
             ORDER BY 1 LIMIT 1)
      FROM keys
     WHERE keys.key IS NOT NULL
)
SELECT k.key
  FROM keys AS k
  LEFT JOIN {schema}.concurrency_limits AS l ON l.key = k.key
 WHERE k.key IS NOT NULL AND (l.key IS NULL OR l.running < l.max_running)
 LIMIT %(limit)s

-- name: prune_concurrency_limits
-- Drop the counts of keys with nothing running or blocked for an hour (a claim makes one again).
DELETE FROM {schema}.concurrency_limits AS l
 WHERE l.key IN (SELECT c.key FROM {schema}.concurrency_limits AS c
                  WHERE c.running = 0 AND c.updated_at < now() - interval '1 hour'
                  LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED)
   AND l.running = 0
   AND NOT EXISTS (SELECT 1 FROM {schema}.tasks AS t
                    WHERE t.status = 'BLOCKED' AND t.headers ->> 'concurrency_key' = l.key)

-- name: reclaim_expired
-- Take back rows whose lease ran out (their worker died or lost the database): PENDING again,
-- or DEAD with reason "worker lost" once the task has lost %(max_lost)s workers (since its last
-- requeue from the dead letters, if any), giving a concurrency limit's count back. Returns the previous owner for the log, and the chord
-- a finished row belongs to (for its counter), oldest lease first. Leases that ran out before
-- %(floor)s (NULL: no floor) are left to a later call without one.
WITH expired AS (
    SELECT id, claimed_by, attempt, lease_until
      FROM {schema}.tasks
     WHERE status = 'RUNNING' AND lease_until < now()
       AND lease_until >= COALESCE(%(floor)s::timestamptz, '-infinity')
     ORDER BY lease_until
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELLED'
                         -- In bigint: counters edited by hand could overflow an integer.
                         WHEN t.attempt::bigint - t.requeued_attempt - t.retries >= %(max_lost)s
                              THEN 'DEAD'
                         ELSE 'PENDING' END,
           error = 'worker lost: lease of ' || e.claimed_by || ' expired at ' || e.lease_until::text,
           run_at = now(), claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM expired AS e
     WHERE t.id = e.id
    RETURNING t.id, t.name, t.queue, t.status, t.attempt, t.retries, e.claimed_by AS previous_owner,
              e.lease_until AS expired_at, t.headers ->> 'chord' AS chord,
              {schema}.concurrency_key(t.headers) AS limit_key
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, outcome, error)
    SELECT d.id, d.attempt, d.previous_owner, 'lost', 'lease expired'
      FROM done AS d
-- insert: give_counts_back
)
SELECT id, name, queue, status, attempt, retries, previous_owner, expired_at, chord, limit_key
  FROM done

-- name: reclaimed_until
-- Run after reclaim_expired, in its transaction: the time (database clock) up to which every
-- lease from %(floor)s on has been taken back. That is now(), unless a row whose lease ran out
-- before it is still RUNNING: one that reclaim_expired skipped because another transaction held
-- it (a reclaim, a renewal or an outcome write, perhaps rolled back since by a killed worker or
-- a restarted server), one past its batch limit, or one committed after its statement began. The
-- oldest such lease is the answer then, so that a floor taken from it never passes the row.
-- Reads the lease index from the floor to the first such row (or to now()), as the reclaim did.
SELECT LEAST(now(), (SELECT min(lease_until)
                       FROM {schema}.tasks
                      WHERE status = 'RUNNING' AND lease_until < now()
                        AND lease_until >= COALESCE(%(floor)s::timestamptz, '-infinity'))) AS until

-- name: transaction_time
-- The current transaction's start on the database clock (what now() reads in its statements).
SELECT now() AS now

-- name: revoke
-- Cancel a task: PENDING (or BLOCKED) becomes CANCELLED at once; RUNNING gets cancel_requested, which blocks a
-- SUCCESS write. Its worker hears of it by NOTIFY on the cancel channel ("<id> <signal>", sent
-- at commit), and from its next renewal should that be lost. The signal to stop the task with
-- (terminate=True) stays in the headers for the renewal's path; revoked_by names who asked
-- (the caller's name for itself, else its source: the app's task_source or its role).
WITH who AS (
    SELECT COALESCE(%(by)s::text, NULLIF(current_setting('pgtasks.source', true), ''),
                    current_user::text) AS name
), revoked AS (
    UPDATE {schema}.tasks
       SET status = CASE WHEN status = 'RUNNING' THEN status ELSE 'CANCELLED' END,
           cancel_requested = true,
           -- Celery's message: AsyncResult.get() raises TaskRevokedError('revoked').
           error = CASE WHEN status = 'RUNNING' THEN error ELSE 'revoked' END,
           -- Only this revoke's signal counts: one the row was enqueued with is dropped.
           headers = CASE WHEN jsonb_typeof(headers) = 'object'
                          THEN (headers - 'revoke_signal') || jsonb_strip_nulls(jsonb_build_object(
                                   'revoked_by', who.name,
                                   'revoke_signal', CASE WHEN status = 'RUNNING'
                                                         THEN %(signal)s::text END))
                          ELSE headers END,
           updated_at = now()
      FROM who
     WHERE id = %(id)s AND status IN ('PENDING', 'BLOCKED', 'RUNNING')
    RETURNING id, status
)
SELECT status,
       CASE WHEN status = 'RUNNING'
            THEN pg_notify(%(channel)s, id || ' ' || COALESCE(%(signal)s::text, '')) END
  FROM revoked

-- name: revoke_signal
-- The signal a revoke of a running task asked to stop it with (terminate=True), if any.
SELECT headers ->> 'revoke_signal' AS signal
  FROM {schema}.tasks
 WHERE id = %(id)s AND cancel_requested AND jsonb_typeof(headers) = 'object'

-- name: may_follow
-- Whether the source of a row may enqueue a task (see producer_rules): asked before a worker
-- calls an errback in its own process rather than enqueueing it.
SELECT {schema}.may_enqueue(t.source, %(name)s, %(queue)s, %(priority)s) AS allowed
  FROM {schema}.tasks AS t
 WHERE t.id = %(id)s

-- name: cancel_state
-- Whether the row a worker runs was revoked, and the signal a terminating revoke stored: what
-- the worker acts on when a notification says a task was revoked (the notification itself is
-- only a reason to look).
SELECT cancel_requested,
       CASE WHEN cancel_requested AND jsonb_typeof(headers) = 'object'
            THEN headers ->> 'revoke_signal' END AS signal
  FROM {schema}.tasks
 WHERE id = %(id)s AND claimed_by = %(worker)s AND attempt = %(attempt)s
   AND status = 'RUNNING'

-- name: cancel_requested
-- Whether a task was revoked (AbortableTask.is_aborted, Request.cancelled).
SELECT cancel_requested FROM {schema}.tasks WHERE id = %(id)s

-- name: get_result
-- What AsyncResult needs: the live row (if still there) and the stored result (if kept).
SELECT t.status, t.retries, t.error, t.traceback AS task_traceback, t.name,
       -- A row's headers are whatever its producer wrote: only a boolean counts.
       CASE WHEN jsonb_typeof(t.headers -> 'ignore_result') = 'boolean'
            THEN (t.headers ->> 'ignore_result')::boolean ELSE false END AS ignore_result,
       r.state, r.content_type, r.content_encoding, r.result, r.traceback, r.date_done
  FROM (SELECT %(id)s::text AS id) AS k
  LEFT JOIN {schema}.tasks AS t ON t.id = k.id
  LEFT JOIN {schema}.results AS r ON r.task_id = k.id

-- name: get_task
-- One task row, for inspection and tests.
SELECT id, name, queue, priority, status, run_at, expires_at, attempt, retries, max_retries,
       claimed_by, lease_until, cancel_requested, error, traceback, headers,
       payload::text AS payload, content_type, created_at, updated_at
  FROM {schema}.tasks
 WHERE id = %(id)s

-- name: forget_result
-- Drop a stored result (AsyncResult.forget), and the task's row once it has finished, so the id
-- reads as PENDING again as in Celery. Dead-lettered rows stay for requeue.
WITH result_gone AS (
    DELETE FROM {schema}.results WHERE task_id = %(id)s
)
DELETE FROM {schema}.tasks
 WHERE id = %(id)s AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')

-- name: register_worker
-- Announce a worker (for status and inspect); refreshed by heartbeat_worker.
INSERT INTO {schema}.workers (id, host, pid, queues, concurrency)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s)
ON CONFLICT (id) DO UPDATE
   SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
       concurrency = EXCLUDED.concurrency, heartbeat_at = now()

-- name: park_worker
-- An idle worker waits here, until %(seconds)s from now by the database clock (parking again
-- moves that on): for a task handed to it by an enqueue (see insert_task_handoff) where
-- %(handoff)s, and for notifications of due rows either way (see notify_due). The lock waits
-- for the single enqueues that looked for a waiting worker before this park and found none:
-- they commit first, and the worker's next claim finds their rows.
WITH gate AS (
    SELECT pg_advisory_xact_lock(x'70677467'::int, hashtext(%(channel_due)s))
)
INSERT INTO {schema}.parked_workers AS w (worker, channel, queues, skip_names, lease, until,
                                         handoff)
SELECT %(worker)s, %(channel)s, %(queues)s, %(skip_names)s, %(lease)s,
       now() + make_interval(secs => %(seconds)s::float8), %(handoff)s
  FROM gate
ON CONFLICT (worker) DO UPDATE
   SET channel = EXCLUDED.channel, queues = EXCLUDED.queues, skip_names = EXCLUDED.skip_names,
       lease = EXCLUDED.lease, until = EXCLUDED.until, handoff = EXCLUDED.handoff

-- name: unpark_worker
-- The worker is stopping, or cannot hear notifications: no more hand-offs or wake-ups. A
-- producer handing it a task right now holds the row's lock until its statement ends, and the
-- delete waits for it.
DELETE FROM {schema}.parked_workers WHERE worker = %(worker)s

-- name: busy_worker
-- The worker went back to work: no more hand-offs (waiting as unpark_worker does for one being
-- made), while enqueues go on waking it for %(seconds)s, in case its slots free up before it
-- parks again.
UPDATE {schema}.parked_workers
   SET handoff = false, until = now() + make_interval(secs => %(seconds)s::float8)
 WHERE worker = %(worker)s

-- name: prune_parked_workers
-- Forget waits that ran out a minute ago or more: the rows of workers killed while they waited
-- (a worker that stops deletes its own) and of workers busy since. Enqueues pass them over
-- already; this keeps them from piling up, so that the look for a waiting worker stays a look
-- at a few rows. A worker that parks again writes its row anew.
DELETE FROM {schema}.parked_workers AS p
 WHERE p.worker IN (SELECT q.worker FROM {schema}.parked_workers AS q
                     WHERE q.until < now() - interval '1 minute'
                     LIMIT %(limit)s
                       FOR UPDATE SKIP LOCKED)

-- name: adopt
-- This worker's RUNNING rows that it does not know it holds (handed off to it while it did not
-- listen), as a claim returns them. Rare: after the worker's listening connection came back,
-- and as it stops.
-- insert: adopted_row
 WHERE t.status = 'RUNNING' AND t.claimed_by = %(worker)s AND t.id <> ALL(%(known)s::text[])

-- name: heartbeat_worker
-- Mark a worker alive.
UPDATE {schema}.workers SET heartbeat_at = now() WHERE id = %(id)s

-- name: unregister_worker
-- Remove a worker that stopped cleanly.
DELETE FROM {schema}.workers WHERE id = %(id)s

-- name: purge
-- Delete waiting tasks (of the given queues, or all when NULL); running ones are left alone.
-- With %(until)s (when count_waiting counted them), only those enqueued by then: a purge that
-- asked first deletes no more than it said.
DELETE FROM {schema}.tasks
 WHERE status IN ('PENDING', 'BLOCKED')
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
   AND (%(until)s::timestamptz IS NULL OR created_at <= %(until)s::timestamptz)

-- name: count_waiting
-- How many waiting tasks a purge of the given queues (all when NULL) would delete, and when
-- (the database clock) they were counted.
SELECT count(*) AS n, now() AS counted_at
  FROM {schema}.tasks
 WHERE status IN ('PENDING', 'BLOCKED')
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))

-- name: prune_finished
-- Retention: remove finished rows (with their attempt history and effects), old results past
-- their age, lapsed unique keys and week-old tick rows; at most %(limit)s of each per call (the
-- pruner calls again while a call comes back full). Rows older than the floors (NULL: none) are
-- left to a later call without floors. Finished rows and results go oldest first; the newest
-- of each deleted (task_last, result_last) is where a next call after a full one can start,
-- and the cutoffs where one after a short call can.
WITH tasks_gone AS (
    -- SKIP LOCKED: the pruners of several workers take disjoint rows instead of queueing
    -- behind each other's deletes.
    -- The rows are found and locked first, then deleted by their physical address (a locked
    -- row cannot move): no index lookup per row, and no plan that hashes the subquery and scans
    -- the whole table, as "id IN (subquery)" gets.
    DELETE FROM {schema}.tasks
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM {schema}.tasks
                             WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
                               AND updated_at < now() - make_interval(secs => %(task_age)s::float8)
                               AND updated_at >= COALESCE(%(task_floor)s::timestamptz, '-infinity')
                             ORDER BY updated_at
                             LIMIT %(limit)s
                               FOR UPDATE SKIP LOCKED))
    RETURNING id, updated_at
), attempts_gone AS (
    DELETE FROM {schema}.attempts WHERE task_id = ANY(ARRAY(SELECT id FROM tasks_gone))
), effects_gone AS (
    DELETE FROM {schema}.effects WHERE task_id = ANY(ARRAY(SELECT id FROM tasks_gone))
), ticks_gone AS (
    -- Tick rows only settle races between schedulers (seconds); each entry's last tick is
    -- kept in schedule_entries, so a week of them is plenty.
    DELETE FROM {schema}.schedule_ticks
     WHERE (name, tick_at) IN (SELECT name, tick_at FROM {schema}.schedule_ticks
                                WHERE enqueued_at < now() - interval '7 days'
                                LIMIT %(limit)s)
), keys_gone AS (
    -- Unique keys whose window has passed (an enqueue would take them over anyway).
    DELETE FROM {schema}.unique_keys
     WHERE key IN (SELECT key FROM {schema}.unique_keys
                    WHERE held_until < now()
                    LIMIT %(limit)s
                      FOR UPDATE SKIP LOCKED)
), results_gone AS (
    DELETE FROM {schema}.results
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM {schema}.results
                             WHERE date_done < now() - make_interval(secs => %(result_age)s::float8)
                               AND date_done >= COALESCE(%(result_floor)s::timestamptz, '-infinity')
                             ORDER BY date_done
                             LIMIT %(limit)s
                               FOR UPDATE SKIP LOCKED))
    RETURNING date_done
)
SELECT (SELECT count(*) FROM tasks_gone) AS tasks, (SELECT count(*) FROM results_gone) AS results,
       (SELECT max(updated_at) FROM tasks_gone) AS task_last,
       (SELECT max(date_done) FROM results_gone) AS result_last,
       now() - make_interval(secs => %(task_age)s::float8) AS task_cutoff,
       now() - make_interval(secs => %(result_age)s::float8) AS result_cutoff

-- name: count_by_status
-- Row counts by queue and status, for status commands and tests.
SELECT queue, status, count(*) AS n FROM {schema}.tasks GROUP BY queue, status ORDER BY queue, status

-- name: schema_version
-- The newest applied migration, or NULL when the schema has none.
SELECT max(version) AS version FROM {schema}.migrations

-- name: tasks_row_security
-- Whether row-level security applies to this role on the task table (COPY FROM is refused then).
SELECT row_security_active(c.oid) AS active
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = 'tasks'

-- name: count_unfinished
-- Tasks of the given queues still waiting (due, scheduled or blocked by a concurrency limit) or
-- running: burst mode's exit test. Counted in parts so that each reads its partial index (the
-- claim, blocked and lease indexes) and costs what is left, not a scan of every finished row.
SELECT (SELECT count(*) FROM {schema}.tasks
         WHERE status = 'PENDING' AND queue = ANY(%(queues)s::text[]))
     + (SELECT count(*) FROM {schema}.tasks
         WHERE status = 'BLOCKED' AND queue = ANY(%(queues)s::text[]))
     + (SELECT count(*) FROM {schema}.tasks
         WHERE status = 'RUNNING' AND queue = ANY(%(queues)s::text[])) AS n

-- name: any_unfinished
-- Whether any task of the given queues is still waiting (due, scheduled or blocked) or running:
-- count_unfinished's test for zero, which stops at the first row found instead of counting
-- every one (cheap enough to ask many times a second while a large queue drains). Each part
-- is ordered as its partial index (the claim, lease and blocked indexes), so that the planner
-- reads that index rather than scanning the table for a first row it expects to meet soon.
SELECT (SELECT true FROM {schema}.tasks
         WHERE status = 'PENDING' AND queue = ANY(%(queues)s::text[])
         ORDER BY queue, priority DESC, run_at, created_at LIMIT 1) IS NOT NULL
    OR (SELECT true FROM {schema}.tasks
         WHERE status = 'RUNNING' AND queue = ANY(%(queues)s::text[])
         ORDER BY lease_until LIMIT 1) IS NOT NULL
    OR (SELECT true FROM {schema}.tasks
         WHERE status = 'BLOCKED' AND queue = ANY(%(queues)s::text[])
         ORDER BY headers ->> 'concurrency_key', priority DESC, run_at, created_at
         LIMIT 1) IS NOT NULL AS any

-- name: announce_worker_tasks
-- Record the task names a worker has registered (for inspect registered).
UPDATE {schema}.workers SET tasks = %(tasks)s::text[] WHERE id = %(id)s

-- name: live_workers
-- Workers whose heartbeat is newer than %(within)s seconds, for status and inspect.
SELECT id, host, pid, queues, concurrency, tasks, started_at, heartbeat_at,
       extract(epoch FROM now() - started_at)::float8 AS uptime
  FROM {schema}.workers
 WHERE heartbeat_at > now() - make_interval(secs => %(within)s::float8)
 ORDER BY id

-- name: task_known
-- Whether a live worker consuming %(queue)s has registered the task %(name)s: a worker that
-- meets a name it does not know hands the row on when one does, and fails it otherwise.
SELECT EXISTS (
    SELECT 1
      FROM {schema}.workers
     WHERE heartbeat_at > now() - make_interval(secs => %(within)s::float8)
       AND %(name)s = ANY(tasks)
       AND %(queue)s = ANY(queues)
) AS known

-- name: running_tasks
-- RUNNING rows with their owners, for inspect active and reserved.
SELECT id, name, queue, priority, attempt, retries, claimed_by, lease_until, headers,
       payload::text AS payload, content_type, updated_at
  FROM {schema}.tasks
 WHERE status = 'RUNNING'
 ORDER BY claimed_by, updated_at, id

-- name: scheduled_tasks
-- PENDING rows whose run_at is still in the future (eta, countdown, retry backoff).
SELECT id, name, queue, priority, run_at, retries, headers, payload::text AS payload, content_type
  FROM {schema}.tasks
 WHERE status = 'PENDING' AND run_at > now()
 ORDER BY run_at, id
 LIMIT %(limit)s

-- name: worker_totals
-- Attempts each of the given workers finished, by task name (inspect stats' "total").
SELECT a.worker, COALESCE(t.name, '?') AS name, count(*) AS n
  FROM {schema}.attempts AS a
  LEFT JOIN {schema}.tasks AS t ON t.id = a.task_id
 WHERE a.worker = ANY(%(workers)s::text[])
 GROUP BY a.worker, COALESCE(t.name, '?')
 ORDER BY a.worker, 2

-- Canvas: chords, saved group results, children. -------------------------------------------

-- name: insert_chords
-- Create chord counters (one per chord), before or with their header members' rows; a chord
-- a worker creates as a follow-up carries the source of the row it follows (NULL: the
-- caller's own), whose rules its body is held to.
INSERT INTO {schema}.chords (id, member_ids, remaining, body, source)
SELECT c.id, ARRAY(SELECT jsonb_array_elements_text(c.members)),
       jsonb_array_length(c.members), c.body,
       COALESCE(c.source, NULLIF(current_setting('pgtasks.source', true), ''),
                current_user::text)
  FROM unnest(%(ids)s::text[], %(members)s::jsonb[], %(bodies)s::jsonb[], %(sources)s::text[])
    AS c(id, members, body, source)

-- name: decrement_chords
-- Count finished header members, one (chord, member) pair for each member that ended, and only
-- members the chord names: a row's "chord" header is written by whoever enqueued it, and a
-- task that is not a member counts for nothing. RETURNING the counters after the update, so
-- the transaction that brings one to zero knows it must enqueue the body (under the rules of
-- the chord's source).
WITH pairs AS (
    SELECT h.chord, h.member
      FROM unnest(%(chords)s::text[], %(members)s::text[]) AS h(chord, member)
), named AS (
    SELECT c.id, m.member
      FROM {schema}.chords AS c
     CROSS JOIN LATERAL unnest(c.member_ids) AS m(member)
     WHERE c.id = ANY(ARRAY(SELECT chord FROM pairs))
), hits AS (
    SELECT p.chord AS id, count(*)::int AS n
      FROM pairs AS p
      JOIN named AS k ON k.id = p.chord AND k.member = p.member
     GROUP BY p.chord
), locked AS (
    SELECT c.id FROM {schema}.chords AS c JOIN hits USING (id) ORDER BY c.id FOR UPDATE OF c
)
UPDATE {schema}.chords AS c
   SET remaining = greatest(c.remaining - hits.n, 0)
  FROM hits, locked
 WHERE c.id = hits.id AND c.id = locked.id
RETURNING c.id, c.remaining, c.member_ids, c.body, c.source

-- name: delete_chords
-- Drop counters whose body has been enqueued (or whose error has been recorded).
DELETE FROM {schema}.chords WHERE id = ANY(%(ids)s::text[]) AND remaining = 0

-- name: chord_member_results
-- Header members' outcomes in header order, for the chord body's argument.
SELECT m.idx, m.id, r.state, r.content_type, r.content_encoding, r.result, t.status, t.error
  FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS m(id, idx)
  LEFT JOIN {schema}.results AS r ON r.task_id = m.id
  LEFT JOIN {schema}.tasks AS t ON t.id = m.id
 ORDER BY m.idx

-- name: store_results
-- Record results decided without running a task (a chord's error, a failed chain's later steps).
INSERT INTO {schema}.results (task_id, state, content_type, result, traceback, date_done)
SELECT * , now()
  FROM unnest(%(ids)s::text[], %(states)s::text[], %(content_types)s::text[],
              %(results)s::bytea[], %(tracebacks)s::text[])
ON CONFLICT (task_id) DO UPDATE
   SET state = EXCLUDED.state, content_type = EXCLUDED.content_type, result = EXCLUDED.result,
       traceback = EXCLUDED.traceback, date_done = EXCLUDED.date_done

-- name: store_decided_results
-- store_results for what an outcome decides about tasks that will never run (a failed chain's
-- later steps, the body of a chord whose member failed): their ids come from the finished
-- row's headers, which its producer wrote, so a result is written only for an id that names
-- no task row and has no result yet.
INSERT INTO {schema}.results (task_id, state, content_type, result, traceback, date_done)
SELECT i.*, now()
  FROM unnest(%(ids)s::text[], %(states)s::text[], %(content_types)s::text[],
              %(results)s::bytea[], %(tracebacks)s::text[])
    AS i(id, state, content_type, result, traceback)
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks AS t WHERE t.id = i.id)
ON CONFLICT (task_id) DO NOTHING

-- name: save_group_result
-- GroupResult.save(): remember a group's member ids under the group id.
INSERT INTO {schema}.group_results (id, result_ids) VALUES (%(id)s, %(result_ids)s::text[])
ON CONFLICT (id) DO UPDATE SET result_ids = EXCLUDED.result_ids, date_done = now()

-- name: restore_group_result
-- GroupResult.restore(): the member ids saved under a group id.
SELECT result_ids FROM {schema}.group_results WHERE id = %(id)s

-- name: delete_group_result
-- GroupResult.delete(): forget a saved group.
DELETE FROM {schema}.group_results WHERE id = %(id)s

-- name: task_children
-- AsyncResult.children: the calls enqueued by a task's completion (links, next chain step).
SELECT id, name
  FROM {schema}.tasks
 WHERE headers ? 'parent_id' AND headers ->> 'parent_id' = %(id)s
 ORDER BY created_at, id

-- name: revoked_tasks
-- Ids of revoked tasks still in the table, newest first (inspect revoked).
SELECT id
  FROM {schema}.tasks
 WHERE status = 'CANCELLED' OR (cancel_requested AND status = 'RUNNING')
 ORDER BY updated_at DESC, id
 LIMIT %(limit)s

-- name: sync_schedule
-- Record a scheduler's periodic entries; a new entry's first tick is the first after now (or
-- after %(now)s, a scheduler's injected clock). Changed entries keep their last tick.
INSERT INTO {schema}.schedule_entries AS e (name, task, schedule, created_at)
SELECT n.name, n.task, n.schedule, COALESCE(%(now)s::timestamptz, now())
  FROM unnest(%(names)s::text[], %(tasks)s::text[], %(schedules)s::text[])
    AS n(name, task, schedule)
 ORDER BY n.name
ON CONFLICT (name) DO UPDATE
   SET task = EXCLUDED.task, schedule = EXCLUDED.schedule, updated_at = now()
 WHERE e.task IS DISTINCT FROM EXCLUDED.task OR e.schedule IS DISTINCT FROM EXCLUDED.schedule

-- name: schedule_state
-- The database clock and each entry's last enqueued tick, for one scheduler pass.
SELECT now() AS now, array_agg(name) AS names, array_agg(last_tick) AS last_ticks,
       array_agg(created_at) AS created
  FROM {schema}.schedule_entries
 WHERE name = ANY(%(names)s::text[])

-- name: enqueue_tick
-- One periodic tick: the (entry, tick) row and its task in one statement. Only the scheduler
-- whose tick row goes in inserts the task; the others find the tick taken and insert nothing.
WITH tick AS (
    INSERT INTO {schema}.schedule_ticks (name, tick_at, task_id)
    VALUES (%(entry)s, %(tick_at)s, %(id)s)
    ON CONFLICT DO NOTHING
    RETURNING task_id
), entry AS (
    UPDATE {schema}.schedule_entries
       SET last_tick = GREATEST(last_tick, %(tick_at)s::timestamptz),
           next_tick = GREATEST(next_tick, %(next_tick)s::timestamptz), updated_at = now()
     WHERE name = %(entry)s
), task AS (
    INSERT INTO {schema}.tasks
        (id, name, queue, priority, run_at, expires_at, content_type, content_encoding,
         payload, payload_raw, headers, max_retries)
    SELECT %(id)s, %(name)s, %(queue)s, %(priority)s,
           COALESCE(%(eta)s::timestamptz,
                    now() + make_interval(secs => COALESCE(%(countdown)s::float8, 0))),
           COALESCE(%(expires_at)s::timestamptz,
                    now() + make_interval(secs => %(expires_in)s::float8)),
           %(content_type)s, %(content_encoding)s, %(payload)s::json, %(payload_raw)s::bytea,
           %(headers)s::jsonb, %(max_retries)s
      FROM tick
    RETURNING id
)
SELECT count(*)::int AS enqueued FROM task

-- name: schedule_entries
-- Every recorded periodic entry, for `pgtasks beat --list`.
SELECT name, task, schedule, last_tick, next_tick, created_at, updated_at
  FROM {schema}.schedule_entries
 ORDER BY name

-- Operators: queue stats, dead letters, health, and the dashboard's task views. --------------

-- name: queue_stats
-- Per queue: due and scheduled PENDING rows, the oldest due row's wait, RUNNING rows and expired
-- leases, DEAD rows, rows finished within the window and attempts finished within it. Each part
-- reads a partial index (the attempts part, the history's finished_at index).
WITH pending AS (
    SELECT queue,
           count(*) FILTER (WHERE run_at <= now()) AS pending_due,
           count(*) FILTER (WHERE run_at > now()) AS scheduled,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
      FROM {schema}.tasks
     WHERE status = 'PENDING'
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
     GROUP BY queue
), blocked AS (
    SELECT queue, count(*) AS blocked
      FROM {schema}.tasks
     WHERE status = 'BLOCKED'
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
     GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE lease_until < now()) AS expired_leases
      FROM {schema}.tasks
     WHERE status = 'RUNNING'
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
     GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead
      FROM {schema}.tasks
     WHERE status = 'DEAD'
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
     GROUP BY queue
), finished AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE status = 'FAILED') AS failed,
           count(*) FILTER (WHERE status = 'CANCELLED') AS cancelled
      FROM {schema}.tasks
     WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND updated_at > now() - make_interval(secs => %(window)s::float8)
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
     GROUP BY queue
), ran AS (
    SELECT t.queue, count(*) AS finished_attempts
      FROM {schema}.attempts AS a
      JOIN {schema}.tasks AS t ON t.id = a.task_id
     WHERE a.finished_at > now() - make_interval(secs => %(window)s::float8)
       AND a.outcome <> 'requeued'
       AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))
     GROUP BY t.queue
), names AS (
    SELECT queue FROM pending UNION SELECT queue FROM blocked UNION SELECT queue FROM running
    UNION SELECT queue FROM dead
    UNION SELECT queue FROM finished UNION SELECT queue FROM ran
)
SELECT n.queue,
       COALESCE(p.pending_due, 0)::int AS pending_due,
       COALESCE(p.scheduled, 0)::int AS scheduled,
       COALESCE(b.blocked, 0)::int AS blocked,
       COALESCE(r.running, 0)::int AS running,
       COALESCE(r.expired_leases, 0)::int AS expired_leases,
       COALESCE(d.dead, 0)::int AS dead,
       COALESCE(f.completed, 0)::int AS completed,
       COALESCE(f.failed, 0)::int AS failed,
       COALESCE(f.cancelled, 0)::int AS cancelled,
       extract(epoch FROM now() - p.oldest_due)::float8 AS oldest_due_age,
       COALESCE(x.finished_attempts, 0)::int AS finished_attempts
  FROM names AS n
  LEFT JOIN pending AS p USING (queue)
  LEFT JOIN blocked AS b USING (queue)
  LEFT JOIN running AS r USING (queue)
  LEFT JOIN dead AS d USING (queue)
  LEFT JOIN finished AS f USING (queue)
  LEFT JOIN ran AS x USING (queue)
 ORDER BY n.queue

-- name: dead_letters
-- Dead-lettered rows, newest first, optionally of one task name and/or queue.
SELECT id, name, queue, error, attempt, retries, updated_at
  FROM {schema}.tasks
 WHERE status = 'DEAD'
   AND (%(name)s::text IS NULL OR name = %(name)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
 ORDER BY updated_at DESC, id
 LIMIT %(limit)s OFFSET %(offset)s

-- name: task_detail
-- One task row, every column an operator reads, with its stored result's state (if kept).
SELECT t.id, t.name, t.queue, t.priority, t.status, t.run_at, t.expires_at, t.attempt, t.retries,
       t.max_retries, t.requeued_attempt, t.claimed_by, t.lease_until, t.cancel_requested,
       t.error, t.traceback, t.headers, t.content_type, t.content_encoding,
       t.payload::text AS payload, octet_length(t.payload_raw) AS payload_raw_bytes,
       t.created_at, t.updated_at,
       r.state AS result_state, r.date_done AS result_date_done
  FROM {schema}.tasks AS t
  LEFT JOIN {schema}.results AS r ON r.task_id = t.id
 WHERE t.id = %(id)s

-- name: task_attempts
-- A task's run history, oldest first.
SELECT attempt, worker, started_at, finished_at, outcome, error
  FROM {schema}.attempts
 WHERE task_id = %(id)s
 ORDER BY attempt, finished_at

-- name: requeue_dead
-- Dead letters back to PENDING, due now, with a fresh budget: retries 0, and the attempt moved
-- one past the last (never back: it is the fencing token) and recorded as requeued_attempt, from
-- which lost-worker accounting restarts. Fenced on status = 'DEAD', so a row anything else has
-- changed is left alone. The attempt history gains a 'requeued' row; the old result is dropped so
-- the task reads PENDING again. Either the given ids, or (chunked) rows dead at %(until)s.
WITH picked AS (
    SELECT id
      FROM {schema}.tasks
     WHERE status = 'DEAD'
       AND (%(ids)s::text[] IS NULL OR id = ANY(%(ids)s::text[]))
       AND (%(name)s::text IS NULL OR name = %(name)s::text)
       AND updated_at <= COALESCE(%(until)s::timestamptz, now())
     ORDER BY updated_at, id
     LIMIT %(limit)s
       FOR UPDATE
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = 'PENDING', run_at = now(), retries = 0,
           -- Capped as the claim caps it: a row edited to the integer's top still requeues.
           attempt = LEAST(t.attempt, 2147483646) + 1,
           requeued_attempt = LEAST(t.attempt, 2147483646) + 1,
           headers = t.headers - 'rate_slot',
           -- A newer task may hold the key by now: the requeued one gives it up.
           unique_key = NULL,
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM picked
     WHERE t.id = picked.id AND t.status = 'DEAD'
    RETURNING t.id, t.attempt, t.error
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, started_at, outcome, error)
    SELECT d.id, d.attempt, %(by)s, now(), 'requeued', d.error
      FROM done AS d
), result_gone AS (
    DELETE FROM {schema}.results WHERE task_id IN (SELECT id FROM done)
)
SELECT (SELECT count(*) FROM done)::int AS n, COALESCE(%(until)s::timestamptz, now()) AS until

-- name: discard_dead
-- Delete dead letters and their stored results (the attempt history stays). Fenced on
-- status = 'DEAD'. Either the given ids, or (chunked) rows dead at %(until)s.
WITH picked AS (
    SELECT id
      FROM {schema}.tasks
     WHERE status = 'DEAD'
       AND (%(ids)s::text[] IS NULL OR id = ANY(%(ids)s::text[]))
       AND (%(name)s::text IS NULL OR name = %(name)s::text)
       AND updated_at <= COALESCE(%(until)s::timestamptz, now())
     ORDER BY updated_at, id
     LIMIT %(limit)s
       FOR UPDATE
), done AS (
    DELETE FROM {schema}.tasks AS t
     USING picked
     WHERE t.id = picked.id AND t.status = 'DEAD'
    RETURNING t.id
), result_gone AS (
    DELETE FROM {schema}.results WHERE task_id IN (SELECT id FROM done)
)
SELECT (SELECT count(*) FROM done)::int AS n, COALESCE(%(until)s::timestamptz, now()) AS until

-- name: autovacuum_off
-- Whether nothing reclaims the space of the rows the queue deletes and updates: autovacuum off
-- on the server, or turned off for the hot table, the results or the attempt history (a worker
-- says so as it starts, and so does `pgtasks bench --only steady`).
SELECT current_setting('autovacuum') = 'off'
       OR EXISTS (SELECT 1
                    FROM pg_class AS c
                    JOIN pg_namespace AS n ON n.oid = c.relnamespace
                   WHERE n.nspname = %(schema)s
                     AND c.relname IN ('tasks', 'results', 'attempts')
                     AND EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o(option)
                                  -- PostgreSQL's spellings of false, as the option was given
                                  WHERE o.option ~* '^autovacuum_enabled=(f|fa|fal|fals|false|n|no|off|0)$')
                 ) AS off

-- name: health_report
-- One probe: the oldest due PENDING row's wait, expired leases, dead letters (all, and within
-- the window), and workers whose heartbeat is within %(within)s seconds.
SELECT now() AS now,
       (SELECT extract(epoch FROM now() - min(run_at))::float8
          FROM {schema}.tasks WHERE status = 'PENDING' AND run_at <= now()) AS oldest_due_age,
       (SELECT count(*)::int
          FROM {schema}.tasks WHERE status = 'RUNNING' AND lease_until < now()) AS expired_leases,
       (SELECT count(*)::int FROM {schema}.tasks WHERE status = 'DEAD') AS dead_total,
       (SELECT count(*)::int
          FROM {schema}.tasks
         WHERE status = 'DEAD'
           AND updated_at > now() - make_interval(secs => %(window)s::float8)) AS dead_recent,
       (SELECT count(*)::int
          FROM {schema}.workers
         WHERE heartbeat_at > now() - make_interval(secs => %(within)s::float8)) AS live_workers

-- name: task_list
-- Task rows newest first (by updated_at), filtered by status, queue, name and an updated_at range.
SELECT id, name, queue, priority, status, run_at, attempt, retries, max_retries, claimed_by,
       lease_until, error, created_at, updated_at
  FROM {schema}.tasks
 WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(name)s::text IS NULL OR name = %(name)s::text)
   AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR updated_at < %(until)s::timestamptz)
 ORDER BY updated_at DESC, id
 LIMIT %(limit)s OFFSET %(offset)s

-- name: finished_per_minute
-- Attempts finished per minute and outcome within the window (requeues are not runs).
SELECT date_trunc('minute', finished_at) AS minute, outcome, count(*)::int AS n
  FROM {schema}.attempts
 WHERE finished_at > now() - make_interval(secs => %(window)s::float8)
   AND outcome <> 'requeued'
 GROUP BY 1, 2
 ORDER BY 1, 2

-- name: status_totals
-- Rows waiting, running and dead (all of them), and rows finished within the window, by status.
SELECT status, count(*)::int AS n
  FROM {schema}.tasks
 WHERE status IN ('PENDING', 'BLOCKED', 'RUNNING', 'DEAD')
 GROUP BY status
UNION ALL
SELECT status, count(*)::int
  FROM {schema}.tasks
 WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
   AND updated_at > now() - make_interval(secs => %(window)s::float8)
 GROUP BY status

-- Fragments: parts that several queries share word for word, written where a query has the
-- line "-- insert: <fragment>".

-- fragment: give_counts_back
-- Concurrency limits, in every fenced write that ends RUNNING rows (from its CTE "done", whose
-- rows carry limit_key): the keys' RUNNING counts go down by the rows that ended.
), gone AS (
    -- Concurrency limits: the keys whose RUNNING rows ended here give their count back.
    SELECT limit_key AS key, count(*)::int AS n FROM done WHERE limit_key IS NOT NULL
     GROUP BY limit_key
), freeing AS (
    -- Locked in key order (as claims lock them), so no two statements deadlock.
    SELECT l.key FROM {schema}.concurrency_limits AS l
     WHERE l.key = ANY(ARRAY(SELECT key FROM gone))
     ORDER BY l.key
       FOR UPDATE
), freed AS (
    UPDATE {schema}.concurrency_limits AS l
       SET running = GREATEST(l.running - g.n, 0), updated_at = now()
      FROM gone AS g JOIN freeing USING (key)
     WHERE l.key = g.key

-- fragment: claim_due
-- The start of claim_batch and claim_plain, and so the claim order: up to %(scan)s due PENDING
-- rows of the given queues, locked with SKIP LOCKED, as the CTE "due" with what the parts that
-- decide limits read of each (limit_key, limit_max, name, expires_at, whether it holds a rate
-- slot). One ordered index scan per queue (a plain "queue = ANY(...)" would sort every pending
-- row).
WITH due AS (
-- insert: due_columns
      FROM unnest(%(queues)s::text[]) AS q(name)
     CROSS JOIN LATERAL (
-- insert: due_row
               AND queue = q.name
               AND run_at <= now()
             ORDER BY priority DESC, run_at, created_at
             LIMIT %(scan)s
               FOR UPDATE SKIP LOCKED
           ) AS c
     ORDER BY c.priority DESC, c.run_at, c.created_at
     LIMIT %(scan)s

-- fragment: due_row
-- A due scan's candidate rows (the inner SELECT of claim_due and of claim_batch_from_floors'
-- two scans, each adding its own conditions, order and limit): the PENDING rows of the task
-- table, with what the parts that decide limits read of each (see claim_limited).
            SELECT id, priority, run_at, created_at,
                   {schema}.concurrency_key(headers) AS limit_key,
                   headers ->> 'concurrency_limit' AS limit_max,
                   name, expires_at, headers ? 'rate_slot' AS admitted
              FROM {schema}.tasks
             WHERE status = 'PENDING'

-- fragment: due_columns
-- The columns of the CTE "due" that claim_limited reads, from a due scan's rows (c).
    SELECT c.id, c.priority, c.run_at, c.created_at, c.limit_key, c.limit_max, c.name,
           c.expires_at, c.admitted

-- fragment: claimed_columns
-- A claimed row's columns but the last (set_aside), in the order of pgtasks.message.ClaimedTask's
-- fields (built positionally), as claims return them and adopted_row reads them.
       t.id, t.name, t.queue, t.priority, t.attempt, t.retries, t.max_retries,
       t.content_type, t.content_encoding, t.payload::text AS payload, t.payload_raw,
       t.headers, t.run_at, t.expires_at,
       (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
       t.created_at, t.requeued_attempt,

-- fragment: claim_unlimited
-- The end of claim_plain and claim_handed_plain, from their CTE "due": the update, unless a
-- picked row is under a concurrency limit ('LIMITED').
), plain AS (
    SELECT NOT EXISTS (SELECT FROM due WHERE limit_key IS NOT NULL) AS ok
), claimed AS (
    UPDATE {schema}.tasks AS t
       SET status = 'RUNNING', claimed_by = %(worker)s,
           -- A row edited by hand to the integer's top must not fail every claim of its queue.
           attempt = LEAST(t.attempt, 2147483646) + 1,
           lease_until = now() + make_interval(secs => %(lease)s::float8),
           updated_at = now()
     -- By primary key, as claim_batch finds them.
     WHERE t.id = ANY(ARRAY(SELECT id FROM due)) AND (SELECT ok FROM plain)
    RETURNING
-- insert: claimed_columns
              NULL::text AS set_aside
)
SELECT * FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, 'LIMITED'
  FROM plain
 WHERE NOT ok

-- fragment: claim_limited
-- The end of both claims, from their CTE "due" (the rows picked, in claim order, with their
-- limit_key, limit_max, name, expires_at and whether they hold a rate slot): rate limits,
-- concurrency limits, the update and the RETURNING columns.
), rated AS (
    -- Rate limits (the worker names its rate-limited tasks and their intervals): the due rows
    -- of such a task that do not hold a start time yet, numbered in claim order per task. An
    -- expired row is left out: it is cancelled, not run.
    SELECT d.id, 'task:' || d.name AS key, r.every,
           row_number() OVER (PARTITION BY d.name
                              ORDER BY d.priority DESC, d.run_at, d.created_at) - 1 AS place
      FROM due AS d
      JOIN unnest(%(rate_names)s::text[], %(rate_every)s::float8[]) AS r(name, every)
        ON r.name = d.name
     WHERE NOT d.admitted AND (d.expires_at IS NULL OR d.expires_at > now())
), rate_wanted AS (
    SELECT key, max(every) AS every, count(*) AS n FROM rated GROUP BY key
), rate_taken AS (
    -- Each task's next free start time moves on by one interval a row, from now at the
    -- earliest. The upsert locks the task's row (tasks in order), so claims of one task take
    -- their times one after another, whichever worker makes them.
    INSERT INTO {schema}.rate_limits AS b (key, next_at)
    SELECT key, now() + make_interval(secs => every * n) FROM rate_wanted ORDER BY key
    ON CONFLICT (key) DO UPDATE
       SET next_at = greatest(b.next_at, now()) + (EXCLUDED.next_at - now())
    RETURNING b.key, b.next_at
), deferred AS (
    -- The rows whose start time is later than now: they stay PENDING, due at that time and
    -- marked as holding it, so whichever worker claims them then runs them without asking.
    SELECT s.id, s.slot
      FROM (SELECT i.id, t.next_at - make_interval(secs => w.every * (w.n - i.place)) AS slot
              FROM rated AS i JOIN rate_wanted AS w USING (key) JOIN rate_taken AS t USING (key)
           ) AS s
     WHERE s.slot > now()
), picked AS (
    -- The rows this claim takes: the first %(limit)s in claim order of those not waiting for a
    -- start time, and any rate-limited row whose start time is now (a start time given is
    -- never left unused). The claim reads up to %(scan)s rows: the worker reads further after
    -- a claim that set rows aside, so that a backlog of rate-limited rows is set aside in a
    -- few claims rather than a few rows a claim.
    SELECT p.id, p.priority, p.run_at, p.created_at, p.limit_key, p.limit_max
      FROM (SELECT d.*, row_number() OVER (ORDER BY d.priority DESC, d.run_at, d.created_at) AS n
              FROM due AS d
             WHERE d.id NOT IN (SELECT id FROM deferred)) AS p
     WHERE p.n <= %(limit)s OR p.id IN (SELECT id FROM rated)
), wanted AS (
    -- Concurrency limits count the rows that start now (a row waiting for its rate limit's
    -- start time does not hold a place).
    SELECT limit_key AS key, count(*)::int AS n, max(limit_max::int) AS most
      FROM picked
     WHERE limit_key IS NOT NULL
     GROUP BY limit_key
), counted AS (
    -- Each key's RUNNING count: the upsert locks the key's row (keys in order), so claims of
    -- one key decide one after another on its latest count. A key starts as many of its rows
    -- as it has room for. "granted" reads that number back: an update stores it, never more
    -- than the new count; an insert stores the rows wanted, which LEAST brings down to the
    -- count it started.
    INSERT INTO {schema}.concurrency_limits AS l (key, max_running, running, granted)
    SELECT key, most, LEAST(n, most), n FROM wanted ORDER BY key
    ON CONFLICT (key) DO UPDATE
       SET max_running = EXCLUDED.max_running,
           running = l.running
                     + GREATEST(0, LEAST(EXCLUDED.granted, EXCLUDED.max_running - l.running)),
           granted = GREATEST(0, LEAST(EXCLUDED.granted, EXCLUDED.max_running - l.running)),
           updated_at = now()
    RETURNING l.key, LEAST(l.granted, l.running) AS granted
), held AS (
    -- The limited rows past their key's room, in claim order within each key.
    SELECT r.id, r.key
      FROM (SELECT id, limit_key AS key,
                   row_number() OVER (PARTITION BY limit_key
                                      ORDER BY priority DESC, run_at, created_at) AS place
              FROM picked
             WHERE limit_key IS NOT NULL) AS r
      JOIN counted AS c USING (key)
     WHERE r.place > c.granted
), aside AS (
    -- A full key's other due rows are set BLOCKED with it, up to 1000 a key at a time (from
    -- tasks_limited_idx), so that a backlog of one key leaves the claim index in a few claims
    -- rather than a row or two a claim.
    UPDATE {schema}.tasks AS t
       SET status = 'BLOCKED', updated_at = now()
      FROM (SELECT DISTINCT key FROM held) AS k
     CROSS JOIN LATERAL (
            SELECT b.id
              FROM {schema}.tasks AS b
             WHERE b.status = 'PENDING' AND {schema}.concurrency_key(b.headers) = k.key
               AND b.run_at <= now()
             LIMIT 1000
               FOR UPDATE SKIP LOCKED
           ) AS more
     WHERE t.id = more.id AND t.id <> ALL(ARRAY(SELECT id FROM due))
), set_aside AS (
    SELECT id FROM held UNION ALL SELECT id FROM deferred
), slots AS (
    -- The start times of the rows that wait, as one object by id: a lookup by key per row
    -- (a lookup in "deferred" per row would cost the square of its size).
    SELECT COALESCE(jsonb_object_agg(id, slot), '{{}}') AS by_id FROM deferred
)
UPDATE {schema}.tasks AS t
   SET status = CASE WHEN t.id NOT IN (SELECT id FROM set_aside) THEN 'RUNNING'
                     WHEN t.id IN (SELECT id FROM held) THEN 'BLOCKED'
                     ELSE 'PENDING' END,
       claimed_by = CASE WHEN t.id NOT IN (SELECT id FROM set_aside) THEN %(worker)s END,
       -- A row edited by hand to the integer's top must not fail every claim of its queue.
       attempt = CASE WHEN t.id NOT IN (SELECT id FROM set_aside)
                      THEN LEAST(t.attempt, 2147483646) + 1 ELSE t.attempt END,
       lease_until = CASE WHEN t.id NOT IN (SELECT id FROM set_aside)
                          THEN now() + make_interval(secs => %(lease)s::float8) END,
       run_at = COALESCE((s.by_id ->> t.id)::timestamptz, t.run_at),
       headers = CASE WHEN s.by_id ? t.id
                      THEN t.headers || jsonb_build_object('rate_slot', s.by_id -> t.id)
                      ELSE t.headers END,
       updated_at = now()
  FROM slots AS s
 -- The rows are found by one "id = ANY" lookup on the primary key, with no join to "due": in
 -- the generic plan a join guesses that the claim takes many rows and reads the whole table,
 -- or repeats the array lookup once a row (sorting the array each time). The sets of rows
 -- set aside are read hashed. Rows come back in no particular order: the caller sorts them.
 WHERE t.id = ANY(ARRAY(SELECT id FROM picked UNION ALL SELECT id FROM deferred))
RETURNING
-- insert: claimed_columns
          CASE WHEN t.claimed_by IS NULL THEN t.status END AS set_aside

-- fragment: adopted_row
-- A row this worker holds, as a claim returns it (pgtasks.message.ClaimedTask's fields).
SELECT
-- insert: claimed_columns
       NULL::text AS set_aside
  FROM {schema}.tasks AS t

-- fragment: completion_input
-- The outcomes of a batch of successes. Their rows are locked by the fenced write that follows,
-- in no set order, and no deadlock can come of it: the only other write that can hold several
-- of them at once is the worker's renewal, which never waits for a lock (see renew_leases).
-- The worker's other outcome writes (fail_batch, retry_batch, release_batch, which lock theirs
-- the same way) never share a row with this one, a run having one outcome; claims and the
-- reclaimer skip locked rows; a revoke locks one row. (A separate pass that locked the rows in
-- id order first cost 3-4 us a task.)
WITH input AS (
    -- One json array of outcomes (result in base64): cheaper to write than one array per column.
    -- An outcome leaves out what it does not need: store, content_type and result when no
    -- result is kept, state when it is SUCCESS.
    -- started_us: microseconds since the run began, by the worker's clock, so that the start
    -- is stored on the database clock whatever the worker's clock says.
    SELECT i.id, i.attempt, COALESCE(i.store, false) AS store, i.content_type,
           decode(i.result, 'base64') AS result,
           now() - make_interval(secs => i.started_us / 1000000.0::float8) AS started_at,
           COALESCE(i.state, 'SUCCESS') AS state
      FROM json_to_recordset(%(rows)s::json)
        AS i(id text, attempt int, store bool, content_type text, result text,
             started_us int8, state text)

-- fragment: completion_done
-- The start of complete_batch and complete_batch_unstored: the outcomes and the fenced update
-- (its CTE "done").
-- insert: completion_input
), done AS (
    UPDATE {schema}.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END,
           error = CASE WHEN t.cancel_requested
                        THEN 'revoked while running'
                             || COALESCE(' by ' || (t.headers ->> 'revoked_by'), '') END,
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM input AS i
     WHERE t.id = ANY(ARRAY(SELECT id FROM input)) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE  -- see renew_leases
    RETURNING t.id, t.attempt, t.status, t.error, i.store, i.content_type, i.result,
              i.started_at, i.state, {schema}.concurrency_key(t.headers) AS limit_key, t.source

-- fragment: completion_drop
-- The start of complete_batch_drop and complete_batch_drop_unstored: completion_done with a
-- delete where the revoke did not arrive ("dropped") and the update where it did ("kept");
-- "done" is both, with the columns completion_done returns.
-- insert: completion_input
), dropped AS (
    DELETE FROM {schema}.tasks AS t
     USING input AS i
     WHERE t.id = ANY(ARRAY(SELECT id FROM input)) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE  -- see renew_leases
       AND NOT t.cancel_requested
    RETURNING t.id, t.attempt, 'COMPLETED'::text AS status, NULL::text AS error, i.store,
              i.content_type, i.result, i.started_at, i.state,
              {schema}.concurrency_key(t.headers) AS limit_key, t.source
), kept AS (
    UPDATE {schema}.tasks AS t
       SET status = 'CANCELLED',
           error = 'revoked while running' || COALESCE(' by ' || (t.headers ->> 'revoked_by'), ''),
           claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM input AS i
     WHERE t.id = ANY(ARRAY(SELECT id FROM input)) AND t.id = i.id AND t.attempt = i.attempt
       AND t.claimed_by = %(worker)s AND (t.status = 'RUNNING') IS TRUE
       AND t.cancel_requested
    RETURNING t.id, t.attempt, t.status, t.error, i.store, i.content_type, i.result,
              i.started_at, i.state, {schema}.concurrency_key(t.headers) AS limit_key, t.source
), done AS (
    SELECT * FROM dropped
    UNION ALL
    SELECT * FROM kept

-- fragment: completion_drop_history
-- The end of complete_batch_drop and complete_batch_drop_unstored, after "done": the history
-- of a kept row (as completion_history writes it), the history of a deleted row's earlier runs
-- and its effects gone with it (as the pruner deletes them), concurrency counts.
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, started_at, outcome, error)
    SELECT k.id, k.attempt, %(worker)s, k.started_at, lower(k.status), k.error
      FROM kept AS k
), history_gone AS (
    DELETE FROM {schema}.attempts
     WHERE task_id = ANY(ARRAY(SELECT id FROM dropped))
), effects_gone AS (
    DELETE FROM {schema}.effects WHERE task_id = ANY(ARRAY(SELECT id FROM dropped))
-- insert: give_counts_back
)
SELECT id, status, limit_key, source FROM done

-- fragment: completion_results
-- The results part of complete_batch and complete_batch_drop, after "done": the results of the
-- outcomes that keep one (REVOKED for a row whose revoke arrived while it ran).
), saved AS (
    INSERT INTO {schema}.results AS r (task_id, state, content_type, result, traceback, date_done)
    SELECT d.id, CASE d.status WHEN 'COMPLETED' THEN d.state ELSE 'REVOKED' END,
           d.content_type, CASE d.status WHEN 'COMPLETED' THEN d.result END, NULL, now()
      FROM done AS d
     WHERE d.store
    ON CONFLICT (task_id) DO UPDATE
       SET state = EXCLUDED.state, content_type = EXCLUDED.content_type,
           result = EXCLUDED.result, traceback = NULL, date_done = EXCLUDED.date_done

-- fragment: completion_history
-- The end of complete_batch and complete_batch_unstored, after "done": attempt history and
-- concurrency counts.
), history AS (
    INSERT INTO {schema}.attempts (task_id, attempt, worker, started_at, outcome, error)
    SELECT d.id, d.attempt, %(worker)s, d.started_at,
           CASE WHEN d.status = 'COMPLETED' AND d.state = 'IGNORED' THEN 'ignored'
                ELSE lower(d.status) END,
           d.error
      FROM done AS d
-- insert: give_counts_back
)
SELECT id, status, limit_key, source FROM done
