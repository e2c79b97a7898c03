-- 0008: a grant that ends the write time never moves a deadline that has passed.
--
-- An owner that stops (a self-fence, a lost lease, a release) or is fenced by a
-- person grants a zero duration, so a reachable database refuses writes at once.
-- The deadline it set was now(), even when the deadline in force had passed
-- long before: an operator paused past its lease, then resumed, self-fenced and
-- moved the old primary's deadline to the moment it woke. The reconciliation
-- report reads that deadline as "the old primary could write until", and writes
-- it flags as past the deadline are judged by it. A stop now keeps the earlier
-- of the two; a grant with time left (or a new epoch) sets it as before.

CREATE OR REPLACE FUNCTION cellplane_grant(new_epoch bigint, remaining interval, fence text)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    granted timestamptz;
BEGIN
    UPDATE placement_group
       SET epoch = new_epoch,
           lease_deadline = CASE
               WHEN remaining <= interval '0' AND epoch = new_epoch AND lease_deadline IS NOT NULL
                   THEN least(lease_deadline, clock_timestamp())
               ELSE clock_timestamp() + greatest(remaining, interval '0') END,
           fence_reason = fence,
           updated_at = clock_timestamp()
     WHERE epoch <= new_epoch
    RETURNING lease_deadline INTO granted;
    IF granted IS NULL THEN
        RAISE EXCEPTION 'stale epoch: % is below the placement group''s epoch', new_epoch
            USING ERRCODE = 'CPS01';
    END IF;
    RETURN granted;
END
$$;
