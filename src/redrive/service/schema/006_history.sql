-- Delivered retries, kept for `history_retention_days` (service/history.py prunes them)
-- so that a record's story can be told after its retry went through. One row per
-- delivered pending row (its id); the payload is not kept, only what the story needs.
CREATE TABLE redrive_history (
    id                  bigint      PRIMARY KEY,          -- the pending row's id
    destination         text        NOT NULL,
    msg_key             bytea,
    headers             jsonb       NOT NULL,             -- as received: attempt, error, trace
    attempt             integer     NOT NULL,
    group_id            text,
    original_topic      text,
    original_partition  integer,
    original_offset     bigint,
    due_ms              bigint      NOT NULL,
    received_at         timestamptz NOT NULL,
    delivered_at        timestamptz NOT NULL DEFAULT now()
);
-- Rows arrive in delivered_at order: a BRIN index finds the old ones for pruning at
-- almost no cost per insert (a b-tree would be one more entry on the scheduler's path).
CREATE INDEX redrive_history_delivered_ix ON redrive_history USING brin (delivered_at);
CREATE INDEX redrive_history_original_ix
    ON redrive_history (original_topic, original_partition, original_offset);
-- Keys can be larger than a b-tree entry may be: their digest is indexed.
CREATE INDEX redrive_history_key_ix ON redrive_history (md5(msg_key));
CREATE INDEX redrive_dead_letters_key_ix ON redrive_dead_letters (md5(msg_key));
CREATE INDEX redrive_dead_letters_original_ix
    ON redrive_dead_letters (original_topic, original_partition, original_offset);
