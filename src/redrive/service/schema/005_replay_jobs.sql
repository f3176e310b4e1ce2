-- Bulk replays run as background jobs (service/replay_jobs.py): what was asked, how
-- far it got, and each dead letter's part in it, so that a restarted service resumes
-- a job where it stopped and sends nothing twice.
CREATE TABLE redrive_replay_jobs (
    id           bigserial   PRIMARY KEY,
    state        text        NOT NULL DEFAULT 'running'
                             CHECK (state IN ('running', 'done', 'cancelled')),
    actor        text        NOT NULL,
    role         text        NOT NULL,
    destination  text,
    keep         boolean     NOT NULL,
    rate         double precision NOT NULL CHECK (rate > 0),
    filter       jsonb,
    total        integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    cancelled_by text
);
CREATE INDEX redrive_replay_jobs_running_ix ON redrive_replay_jobs (id) WHERE state = 'running';

-- One row per dead letter of a job. todo: not sent yet; sending: in a Kafka
-- transaction whose outcome is being recorded (topic, partition, offset of the
-- letter's copy say where to look after a crash); sent; failed: the broker refused
-- it (error says why, the letter stays); gone: deleted before its turn; cancelled.
CREATE TABLE redrive_replay_job_items (
    job_id          bigint  NOT NULL REFERENCES redrive_replay_jobs (id) ON DELETE CASCADE,
    dead_letter_id  bigint  NOT NULL,
    position        integer NOT NULL,
    state           text    NOT NULL DEFAULT 'todo'
                    CHECK (state IN ('todo', 'sending', 'sent', 'failed', 'gone', 'cancelled')),
    topic           text,
    kafka_partition integer,
    kafka_offset    bigint,
    error           text,
    PRIMARY KEY (job_id, dead_letter_id)
);
CREATE INDEX redrive_replay_job_items_next_ix ON redrive_replay_job_items (job_id, position)
    WHERE state IN ('todo', 'sending');
-- A dead letter is in at most one job that may still send it: a second job over the
-- same letters is refused while the first runs.
CREATE UNIQUE INDEX redrive_replay_job_items_live_uq ON redrive_replay_job_items (dead_letter_id)
    WHERE state IN ('todo', 'sending');
