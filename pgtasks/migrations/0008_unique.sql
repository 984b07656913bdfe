-- Unique tasks: a second enqueue with the same key returns the task that holds it.

-- A key held while its task waits or runs ("finished"), or only until a worker first starts it
-- ("started": waiting, never claimed). The partial unique index decides races between
-- producers: at most one row per key is ever in it. A row leaves it as it finishes (or is first
-- claimed); a "finished" row going back to waiting (a retry, a release) never left it, and a
-- "started" one never comes back (its attempt is past 0, and a release, which gives the
-- attempt back, drops the key, as does an operator's requeue of a dead letter). Rows without a
-- key are not in it.
ALTER TABLE {schema}.tasks ADD COLUMN unique_key text;
ALTER TABLE {schema}.tasks ADD COLUMN unique_until_started boolean NOT NULL DEFAULT false;
CREATE UNIQUE INDEX tasks_unique_key_idx ON {schema}.tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND CASE WHEN unique_until_started THEN status = 'PENDING' AND attempt = 0
               ELSE status IN ('PENDING', 'RUNNING') END;

-- A key held for a window of time from the first enqueue, whatever happens to its task. An
-- enqueue locks the key's row (INSERT ... ON CONFLICT DO UPDATE), so concurrent producers
-- decide one after the other on the row's latest version. The pruner removes lapsed keys.
CREATE TABLE {schema}.unique_keys (
    key        text        PRIMARY KEY,
    task_id    text        NOT NULL,
    held_until timestamptz NOT NULL
);
CREATE INDEX unique_keys_held_until_idx ON {schema}.unique_keys (held_until);
