-- The error groups' rules changed (service/fingerprints.py, its VERSION): a message
-- that is one quoted value keeps it, so KeyError('brand') and KeyError('sku') are two
-- groups. Every stored letter's fingerprint is computed again by
-- store/fingerprint_refresh.py in this migration's transaction: a letter in its own
-- group follows its new fingerprint, a letter an operator moved follows the group it
-- was moved to, and a muted group's new groups are muted. This statement only names
-- the migration's lock on the table, taken before the letters are read.
LOCK TABLE redrive_dead_letters IN SHARE ROW EXCLUSIVE MODE;
