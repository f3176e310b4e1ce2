-- The identities of the requests intake accepted, kept after their rows are gone, so
-- that a request sent again after its first copy was delivered, became a dead letter
-- or released its key's queue is dropped as the repeat it is (store/intake_writes.py).
-- identity: 16 bytes, the request's redrive-id or what it is made of
-- (redrive.requests.identity). keep_from_ms: when the identity's window starts, the
-- later of its acceptance and its due time; pruned `repeat_window_days` after it.
CREATE TABLE redrive_accepted (
    identity      bytea   PRIMARY KEY,
    keep_from_ms  bigint  NOT NULL
);
-- Rows arrive roughly in keep_from_ms order: BRIN finds the old ones for pruning at
-- almost no cost per insert.
CREATE INDEX redrive_accepted_keep_ix ON redrive_accepted USING brin (keep_from_ms);
-- The ledger catches every repeat, pending or not: the pending rows' own unique
-- indexes would only be a second b-tree insert per request on intake's path.
-- (Rows already pending get their identities at start-up: store/identity_backfill.py.)
DROP INDEX redrive_pending_original_uq;
DROP INDEX redrive_pending_request_uq;
