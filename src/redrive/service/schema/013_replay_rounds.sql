-- Replays that cannot make things worse (service/replay_guard.py, service/replay_jobs.py).
--
-- A dead letter that carries redrive-replays / redrive-replay-of came back dead from
-- a replay: how many replays it has had, and the letter it was replayed from. Once it
-- has come back after `quarantine_after_replays` replays it is quarantined: bulk
-- replay jobs skip it, a single replay needs an override. Letters stored before this
-- migration were never replayed with these headers: 0 and NULL, not quarantined (a
-- constant default: no table rewrite).
ALTER TABLE redrive_dead_letters
    ADD COLUMN replays        integer     NOT NULL DEFAULT 0,
    ADD COLUMN replay_of      bigint,
    ADD COLUMN quarantined_at timestamptz;
CREATE INDEX redrive_dead_letters_quarantined_ix ON redrive_dead_letters (id)
    WHERE quarantined_at IS NOT NULL;

-- One row per replay of a dead letter (single or by a job): when, by whom, where to;
-- and, once the copy comes back dead, which letter it came back as, when, with which
-- error (copied: that letter may be replayed and deleted in its turn). `first_id` is
-- the first letter of the line of rounds, so a letter's story finds every round.
CREATE TABLE redrive_replay_rounds (
    id                 bigserial   PRIMARY KEY,
    letter_id          bigint      NOT NULL,
    first_id           bigint      NOT NULL,
    round              integer     NOT NULL,
    replayed_at        timestamptz NOT NULL DEFAULT now(),
    actor              text        NOT NULL,
    job_id             bigint,
    topic              text        NOT NULL,
    kafka_partition    integer,
    returned_id        bigint,
    returned_at        timestamptz,
    error_type         text,
    error_message      text
);
CREATE INDEX redrive_replay_rounds_letter_ix ON redrive_replay_rounds (letter_id, round);
CREATE INDEX redrive_replay_rounds_first_ix ON redrive_replay_rounds (first_id, id);
CREATE INDEX redrive_replay_rounds_returned_ix ON redrive_replay_rounds (returned_id)
    WHERE returned_id IS NOT NULL;

-- A letter that came back from a replay closes its round, whichever way it was stored
-- (intake, an ingested foreign dead-letter topic): the latest open round of the letter
-- it names, with the same count.
CREATE FUNCTION redrive_close_replay_round() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE redrive_replay_rounds
       SET returned_id = NEW.id, returned_at = NEW.dead_at,
           error_type = NEW.error_type, error_message = NEW.error_message
     WHERE id = (SELECT max(id) FROM redrive_replay_rounds
                  WHERE letter_id = NEW.replay_of AND round = NEW.replays
                    AND returned_id IS NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER redrive_dead_letters_close_round AFTER INSERT ON redrive_dead_letters
    FOR EACH ROW WHEN (NEW.replay_of IS NOT NULL) EXECUTE FUNCTION redrive_close_replay_round();

-- Scheduled replay jobs: `scheduled` until `start_at`, then `running` (started_at
-- says when the runner started it). A job made before this migration started when
-- it was made.
ALTER TABLE redrive_replay_jobs DROP CONSTRAINT redrive_replay_jobs_state_check;
ALTER TABLE redrive_replay_jobs
    ADD CONSTRAINT redrive_replay_jobs_state_check
        CHECK (state IN ('scheduled', 'running', 'done', 'cancelled')),
    ADD COLUMN start_at   timestamptz,
    ADD COLUMN started_at timestamptz;
UPDATE redrive_replay_jobs SET started_at = created_at;
CREATE INDEX redrive_replay_jobs_scheduled_ix ON redrive_replay_jobs (start_at)
    WHERE state = 'scheduled';

-- A letter a job passes over (quarantined by the loop guard): `skipped`, with why.
ALTER TABLE redrive_replay_job_items DROP CONSTRAINT redrive_replay_job_items_state_check;
ALTER TABLE redrive_replay_job_items ADD CONSTRAINT redrive_replay_job_items_state_check
    CHECK (state IN ('todo', 'sending', 'sent', 'failed', 'gone', 'cancelled', 'skipped'));
