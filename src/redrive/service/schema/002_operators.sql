-- API tokens: only a SHA-256 of each token is kept; the token is shown once at creation.
CREATE TABLE redrive_api_tokens (
    id          bigserial PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    role        text        NOT NULL CHECK (role IN ('viewer', 'operator')),
    token_hash  text        NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- Every operator action: who, what, on which messages, when.
CREATE TABLE redrive_audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    role        text        NOT NULL,
    action      text        NOT NULL,
    ids         bigint[]    NOT NULL DEFAULT '{}',
    filter      jsonb,
    count       integer     NOT NULL DEFAULT 0,
    detail      jsonb
);
CREATE INDEX redrive_audit_at_ix ON redrive_audit (at DESC, id DESC);

-- Per-minute counts for the rate charts (scheduled, published, dead_lettered, by topic).
CREATE TABLE redrive_stats_minute (
    minute      timestamptz NOT NULL,
    kind        text        NOT NULL,
    topic       text        NOT NULL,
    count       bigint      NOT NULL,
    PRIMARY KEY (minute, kind, topic)
);

CREATE INDEX redrive_dead_letters_group_ix ON redrive_dead_letters (group_id, dead_at DESC);
CREATE INDEX redrive_dead_letters_reason_ix ON redrive_dead_letters (reason_code, dead_at DESC);
CREATE INDEX redrive_pending_destination_ix ON redrive_pending (destination, due_ms);
