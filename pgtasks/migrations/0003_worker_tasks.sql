-- The task names each worker has registered, announced at start-up for `pgtasks inspect registered`.
ALTER TABLE {schema}.workers ADD COLUMN tasks text[] NOT NULL DEFAULT '{{}}';
