-- The store's identity: a random id made once, when this database is first migrated.
-- Intake writes it in the metadata of the offsets it commits, so that a service on
-- another database that finds it there knows its requests group already reads into
-- another store, and refuses to split the requests with it (service/store_guard.py).
-- One row: the CHECK on the key allows no second.
CREATE TABLE redrive_store (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    store_id    uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO redrive_store DEFAULT VALUES;
