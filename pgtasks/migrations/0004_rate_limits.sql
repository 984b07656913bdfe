-- Task rate limits shared by every worker: each key (a task name) hands out start times
-- ("slots") one interval apart; next_at is the first slot not yet given.
CREATE TABLE {schema}.rate_limits (
    key     text        PRIMARY KEY,
    next_at timestamptz NOT NULL
);
