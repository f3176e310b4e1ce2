-- Error groups: the dead letters of one failure, whatever their ids and numbers
-- (service/fingerprints.py says what makes two letters one group).
-- fingerprint: computed once, when the letter is stored (16 hex digits), and kept.
-- error_group: the group the letter is in; its fingerprint, unless an operator moved
-- the letter to another group.
-- Letters stored before are given theirs by store/error_group_backfill.py in this
-- migration's transaction, which then builds the index (faster than keeping it up
-- to date row by row).
ALTER TABLE redrive_dead_letters
    ADD COLUMN fingerprint text,
    ADD COLUMN error_group text;

-- What an operator set on a group, and its title (the type and masked message of
-- its first letter). A row is made with the group's first letter; muted: no alert.
CREATE TABLE redrive_error_groups (
    error_group  text        PRIMARY KEY,
    title        text        NOT NULL,
    muted        boolean     NOT NULL DEFAULT false,
    muted_by     text,
    muted_at     timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);
