-- One unique index entry per stored request instead of two. A request that names its
-- failure (original topic and offset, and group) is already unique on those and its
-- attempt (redrive_pending_original_uq): a redelivered request repeats them, so it is
-- caught there. Only a request that does not name them needs its own coordinates
-- unique. Same guarantee, one b-tree insert fewer on intake's path (benchmark 2).
DROP INDEX redrive_pending_request_uq;
CREATE UNIQUE INDEX redrive_pending_request_uq
    ON redrive_pending (request_topic, request_partition, request_offset)
    WHERE original_topic IS NULL OR original_offset IS NULL;
