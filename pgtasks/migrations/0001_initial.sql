-- The task table, its side tables and the claim indexes.
-- Every object lives in the configured schema; {schema} is substituted as a quoted identifier.

CREATE TABLE {schema}.tasks (
    id               text        PRIMARY KEY,
    name             text        NOT NULL,
    queue            text        NOT NULL DEFAULT 'celery',
    priority         integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'PENDING'
                     CHECK (status IN ('PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'DEAD')),
    run_at           timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz,
    content_type     text        NOT NULL DEFAULT 'application/json',
    content_encoding text        NOT NULL DEFAULT 'utf-8',
    -- json, not jsonb: the text is kept as written (jsonb's numeric turns 1e16 into an integer),
    -- and operators can still query it with -> and ->>.
    payload          json,
    payload_raw      bytea,
    headers          jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    attempt          integer     NOT NULL DEFAULT 0,
    retries          integer     NOT NULL DEFAULT 0,
    max_retries      integer,
    claimed_by       text,
    lease_until      timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    error            text,
    traceback        text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (payload IS NOT NULL OR payload_raw IS NOT NULL),
    CHECK (status <> 'RUNNING' OR (claimed_by IS NOT NULL AND lease_until IS NOT NULL))
);

-- The claim reads this index only: due PENDING rows of a queue in claim order.
CREATE INDEX tasks_claim_idx ON {schema}.tasks (queue, priority DESC, run_at, created_at)
    WHERE status = 'PENDING';
-- Reclaiming finds expired leases here.
CREATE INDEX tasks_lease_idx ON {schema}.tasks (lease_until) WHERE status = 'RUNNING';
-- Retention prunes finished rows by age.
CREATE INDEX tasks_finished_idx ON {schema}.tasks (updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

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

CREATE TABLE {schema}.attempts (
    task_id     text        NOT NULL,
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    error       text,
    PRIMARY KEY (task_id, attempt)
);

CREATE TABLE {schema}.workers (
    id           text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

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

CREATE TRIGGER tasks_notify_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_due({channel});
