-- A dead letter whose record is unknown (service/ingest/originals.py): a share group's
-- letter names its record by topic, partition and offset, and the topic no longer had
-- it when intake read the letter. Replaying it would write an empty record, so a
-- single replay is refused unless the operator gives a value, and replay jobs skip it
-- (service/replay_guard.py). Letters stored before this migration: false (a constant
-- default, no table rewrite; their reason says whether their record was unknown).
ALTER TABLE redrive_dead_letters
    ADD COLUMN record_missing boolean NOT NULL DEFAULT false;
