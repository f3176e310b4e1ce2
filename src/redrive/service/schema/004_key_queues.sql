-- Key order (ordering="key"): the retries of one key of one group, topic and partition
-- form a queue, delivered one at a time in original-offset order (store/key_queues.py).
-- order_queue: the queue's id (NULL: no order kept). held: not to be delivered now
-- (behind its queue's head, or delivered and awaiting its consumer's release).
-- delivered_ms: when a head was delivered; it stays until released.
ALTER TABLE redrive_pending ADD COLUMN order_queue bytea;
ALTER TABLE redrive_pending ADD COLUMN held boolean NOT NULL DEFAULT false;
ALTER TABLE redrive_pending ADD COLUMN delivered_ms bigint;
CREATE INDEX redrive_pending_queue_ix ON redrive_pending (order_queue, original_offset, attempt)
    WHERE order_queue IS NOT NULL;
-- The claim walks only rows that may be delivered: held rows are not in its index.
DROP INDEX IF EXISTS redrive_pending_due_ix;
CREATE INDEX redrive_pending_due_ix ON redrive_pending (due_ms, id) WHERE NOT held;
