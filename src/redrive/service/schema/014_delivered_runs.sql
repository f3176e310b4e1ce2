-- Key queues are delivered in runs (store/key_queues.py): a run's rows stay delivered
-- (delivered_ms set) until their consumer releases them, and a new attempt of one of
-- them holds the rest of its run again. Those writes look for a queue's delivered rows
-- after an offset; this index holds only the rows out now, so the lookup stays small
-- however many rows wait behind their queues' heads.
CREATE INDEX redrive_pending_delivered_ix ON redrive_pending (order_queue, original_offset)
    WHERE delivered_ms IS NOT NULL;
