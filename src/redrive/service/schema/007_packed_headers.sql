-- Headers at rest become MessagePack bytes (service/store/packed_headers.py): an array
-- of [name (str), value (bin or nil)] pairs. The rows stored before as JSON lists of
-- [name, base64 value or null] (a name with a NUL base64 too, flagged "b64") are
-- converted here, in SQL, to exactly the bytes msgpack writes (tested byte for byte).
-- Each table is rewritten once, in one transaction that locks it: on a large store the
-- upgrade takes a while (not measured), with the old version stopped.

-- MessagePack's length prefixes: the shortest form for n, as msgpack writes it.
CREATE FUNCTION pg_temp.redrive_mp_length(n integer, fix integer, fix_max integer,
                                           one integer, two integer, four integer)
RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN fix IS NOT NULL AND n <= fix_max THEN set_byte('\x00'::bytea, 0, fix + n)
        WHEN one IS NOT NULL AND n < 256 THEN set_byte(set_byte('\x0000'::bytea, 0, one), 1, n)
        WHEN n < 65536 THEN set_byte('\x00'::bytea, 0, two) || substring(int4send(n) FROM 3)
        ELSE set_byte('\x00'::bytea, 0, four) || int4send(n)
    END
$$;

CREATE FUNCTION pg_temp.redrive_pack_headers(stored jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT pg_temp.redrive_mp_length(jsonb_array_length(stored), 144, 15, NULL, 220, 221)
        || coalesce(string_agg(
            '\x92'::bytea
            || pg_temp.redrive_mp_length(length(name), 160, 31, 217, 218, 219) || name
            || CASE WHEN value IS NULL THEN '\xc0'::bytea
                    ELSE pg_temp.redrive_mp_length(length(value), NULL, NULL, 196, 197, 198)
                         || value END,
            ''::bytea ORDER BY ord), ''::bytea)
    FROM (
        SELECT ord,
               CASE WHEN jsonb_array_length(item) > 2 THEN decode(item->>0, 'base64')
                    ELSE convert_to(item->>0, 'UTF8') END AS name,
               decode(item->>1, 'base64') AS value
        FROM jsonb_array_elements(stored) WITH ORDINALITY AS items(item, ord)
    ) AS pairs
$$;

ALTER TABLE redrive_pending
    ALTER COLUMN headers TYPE bytea USING pg_temp.redrive_pack_headers(headers);
ALTER TABLE redrive_dead_letters
    ALTER COLUMN headers TYPE bytea USING pg_temp.redrive_pack_headers(headers);
ALTER TABLE redrive_history
    ALTER COLUMN headers TYPE bytea USING pg_temp.redrive_pack_headers(headers);
