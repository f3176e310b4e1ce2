-- Pending retries: one row per accepted retry request, deleted once delivered.
CREATE TABLE redrive_pending (
    id                  bigserial PRIMARY KEY,
    due_ms              bigint      NOT NULL,            -- redrive-retry-at, epoch ms
    destination         text        NOT NULL,
    dest_partition      integer,                         -- redrive-partition; NULL: by key
    msg_key             bytea,
    msg_value           bytea,
    headers             jsonb       NOT NULL,            -- [[name, base64 | null], ...] as received
    attempt             integer     NOT NULL,
    group_id            text,
    deadline_ms         bigint,
    original_topic      text,
    original_partition  integer,
    original_offset     bigint,
    request_topic       text        NOT NULL,            -- where the request was read
    request_partition   integer     NOT NULL,
    request_offset      bigint      NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now(),
    lease_until_ms      bigint,                          -- claimed by a scheduler until then
    lease_owner         text
);

-- A redelivered request (same request coordinates) never makes a second row.
CREATE UNIQUE INDEX redrive_pending_request_uq
    ON redrive_pending (request_topic, request_partition, request_offset);
-- Nor does the same failure written twice by its consumer (unique on
-- original coordinates and attempt, per group).
CREATE UNIQUE INDEX redrive_pending_original_uq
    ON redrive_pending (COALESCE(group_id, ''), original_topic, original_partition,
                        original_offset, attempt)
    WHERE original_topic IS NOT NULL AND original_offset IS NOT NULL;
-- The scheduler's claim walks this index in due order.
CREATE INDEX redrive_pending_due_ix ON redrive_pending (due_ms, id);

-- Dead letters: never dropped; searched, replayed and deleted by operators.
CREATE TABLE redrive_dead_letters (
    id                  bigserial PRIMARY KEY,
    topic               text,                            -- destination, else original topic
    msg_key             bytea,
    msg_value           bytea,
    headers             jsonb       NOT NULL,
    attempt             integer,
    group_id            text,
    original_topic      text,
    original_partition  integer,
    original_offset     bigint,
    original_timestamp  bigint,
    error_type          text,
    error_message       text,
    error_trace         text,
    reason_code         text        NOT NULL,            -- stable, machine-readable
    reason              text        NOT NULL,            -- what a person reads
    source              text        NOT NULL,            -- intake, scheduler, ...
    request_topic       text,
    request_partition   integer,
    request_offset      bigint,
    dead_at             timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX redrive_dead_letters_request_uq
    ON redrive_dead_letters (request_topic, request_partition, request_offset)
    WHERE request_topic IS NOT NULL;
CREATE INDEX redrive_dead_letters_dead_at_ix ON redrive_dead_letters (dead_at DESC, id DESC);
CREATE INDEX redrive_dead_letters_topic_ix ON redrive_dead_letters (topic, dead_at DESC);
CREATE INDEX redrive_dead_letters_error_type_ix ON redrive_dead_letters (error_type, dead_at DESC);

-- Leases in force, for the scheduler to know when a crashed instance's rows free up.
CREATE INDEX redrive_pending_lease_ix ON redrive_pending (lease_until_ms)
    WHERE lease_until_ms IS NOT NULL;
