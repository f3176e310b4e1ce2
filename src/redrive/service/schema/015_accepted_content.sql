-- What each accepted request carried (redrive.requests.content_of: its key and value,
-- and whether a key of ours vouched for its sender), so that a request under an
-- accepted identity is told apart as a copy (the same content: a repeat, dropped) or
-- a forgery (other content: refused, a dead letter of its own; store/intake_writes.py).
-- NULL for the identities accepted before it was kept, and for those the backfill
-- finds: unknown, so a request under one is a repeat, as it was before.
-- A column without a default: added without rewriting the table.
ALTER TABLE redrive_accepted ADD COLUMN content bytea;
