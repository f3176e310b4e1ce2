-- Schedulers claim rows with row locks held in their transaction (FOR UPDATE SKIP
-- LOCKED) instead of writing a lease: the lease columns and their index go.
DROP INDEX IF EXISTS redrive_pending_lease_ix;
ALTER TABLE redrive_pending DROP COLUMN IF EXISTS lease_until_ms;
ALTER TABLE redrive_pending DROP COLUMN IF EXISTS lease_owner;
